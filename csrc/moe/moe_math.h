// Row math of the MoE kernels, shared by the CPU and CUDA backends (host and device inline).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/macros.h"

namespace llmk {
namespace moe {

LLMK_HD float silu(float a) { return a / (1.0f + expf(-a)); }

// The CPU kernels' units over an expert's weights as stored, 32 rows each in two runs of 16
// contiguous rows: gated (w13: gate rows [0, I), up rows [I, 2 I)), run 0 of unit u is gate rows
// [16 u, 16 u + 16) and run 1 the same up rows; otherwise rows [32 u, 32 u + 32). The first row of
// run r (0 or 1) of unit u (moe_amx_cpu.h and moe_bf16_cpu.h take the same units).
inline int64_t stored_unit_row(bool gated, int64_t I, int64_t u, int r) {
  return gated ? r * I + 16 * u : 32 * u + 16 * r;
}

// Router top-k of one token: p = softmax(logit(0 .. E-1)) in fp32, then the k largest p in
// descending order, ties to the lower expert id (vLLM's order); with renormalize the k weights are
// scaled to sum 1. logit(i) returns the fp32 logit of expert i. O(k E): k is small (1 .. 8).
template <typename Logit>
LLMK_HD void softmax_topk(const Logit& logit, int E, int k, bool renormalize, float* w, int32_t* ids) {
  float m = -INFINITY;
  for (int i = 0; i < E; ++i) m = fmaxf(m, logit(i));
  float s = 0.f;
  for (int i = 0; i < E; ++i) s += expf(logit(i) - m);
  const float inv = 1.0f / s;
  // Selection by (p desc, id asc) order: the next pick is the best entry strictly after the last.
  float prev_p = INFINITY, total = 0.f;
  int prev_i = -1;
  for (int j = 0; j < k; ++j) {
    float best_p = -1.f;
    int best_i = -1;
    for (int i = 0; i < E; ++i) {
      const float p = expf(logit(i) - m) * inv;
      const bool after = p < prev_p || (p == prev_p && i > prev_i);
      if (after && p > best_p) {
        best_p = p;
        best_i = i;
      }
    }
    if (best_i < 0) {  // NaN logits: no ordered pick remains; take the lowest unused id
      best_p = 0.f;
      best_i = prev_i + 1;
    }
    w[j] = best_p;
    ids[j] = best_i;
    total += best_p;
    prev_p = best_p;
    prev_i = best_i;
  }
  if (renormalize && total > 0.f)
    for (int j = 0; j < k; ++j) w[j] /= total;
}

// Local expert row of a router id: -1 for ids skipped (-1, not on this rank, or outside the
// table: the CUDA kernels skip what the host cannot check without a sync).
LLMK_HD int32_t local_expert(int32_t id, const int32_t* expert_map, int32_t map_size, int32_t num_experts) {
  if (expert_map) {
    if (id < 0 || id >= map_size) return -1;
    id = expert_map[id];
  }
  return id >= 0 && id < num_experts ? id : -1;
}

}  // namespace moe
}  // namespace llmk
