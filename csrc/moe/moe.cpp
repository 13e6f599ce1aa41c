// MoE front ends: argument checks, then the backend kernels (moe_cpu.cpp, moe.cu).
#include "moe/moe.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "common/checks.h"
#include "common/overlap.h"
#include "moe/moe_workspace.h"

namespace llmk {

namespace {

constexpr int64_t kMaxExperts = 1024;  // the CUDA grouping keeps one counter per expert in shared memory

void check_routing(const TensorView& x, const TensorView& topk_weights, const TensorView& topk_ids,
                   const std::optional<TensorView>& expert_map, int64_t num_experts) {
  check_shape(topk_ids, "topk_ids", {x.size(0), -1}, "[num_tokens, topk]");
  check_dtype(topk_ids, "topk_ids", DType::I32);
  check_contiguous(topk_ids, "topk_ids");
  check_same_device(x, "hidden_states", topk_ids, "topk_ids");
  check_shape(topk_weights, "topk_weights", {x.size(0), topk_ids.size(1)}, "[num_tokens, topk] (from topk_ids)");
  check_dtype(topk_weights, "topk_weights", DType::F32);
  check_contiguous(topk_weights, "topk_weights");
  check_same_device(x, "hidden_states", topk_weights, "topk_weights");
  int64_t id_hi = num_experts;
  if (expert_map) {
    check_ndim(*expert_map, "expert_map", 1, "[global_num_experts]");
    check_dtype(*expert_map, "expert_map", DType::I32);
    check_contiguous(*expert_map, "expert_map");
    check_same_device(x, "hidden_states", *expert_map, "expert_map");
    LLMK_CHECK(expert_map->size(0) <= INT32_MAX, ValueError, "expert_map: too many entries");
    check_index_range(*expert_map, "expert_map", 0, num_experts, "local experts (w13.shape[0])", true);
    id_hi = expert_map->size(0);
  }
  check_index_range(topk_ids, "topk_ids", 0, id_hi,
                    expert_map ? "global experts (expert_map entries)" : "experts (w13.shape[0])", true);
}

// out may be hidden_states itself (vLLM's inplace=True: every read of it precedes the first write);
// any other sharing with an input would be read after it was overwritten.
void check_out_alone(const TensorView& out, std::initializer_list<std::pair<const TensorView*, const char*>> inputs) {
  for (const auto& [t, name] : inputs)
    if (t) check_no_overlap(*t, name, out, "out", std::string(name) == "hidden_states");
}

void check_hidden(const TensorView& out, const TensorView& x, int64_t H) {
  check_ndim(x, "hidden_states", 2, "[num_tokens, hidden_size]");
  check_float(x, "hidden_states");
  check_dim(x, "hidden_states", 1, H, "hidden_size, from w2");
  check_last_dim_contiguous(x, "hidden_states");
  check_shape(out, "out", {x.size(0), H}, "[num_tokens, hidden_size]");
  check_same_dtype(x, "hidden_states", out, "out");
  check_same_device(x, "hidden_states", out, "out");
  check_last_dim_contiguous(out, "out");
}

}  // namespace

#if defined(LLMK_SIMT)
constexpr bool kSimt = true;  // every tensor runs the CUDA kernels
#else
constexpr bool kSimt = false;
#endif

int64_t fused_moe_workspace_bytes(int64_t num_pairs, int64_t num_experts, int64_t hidden, int64_t inter,
                                  int64_t elem_bytes) {
  LLMK_CHECK(num_pairs >= 0 && num_experts >= 1 && hidden >= 1 && inter >= 1 && elem_bytes >= 1, ValueError,
             "fused_moe_workspace_bytes: sizes must be positive");
  return moe::Workspace::layout(num_pairs, num_experts, hidden, inter, elem_bytes).total;
}

void topk_softmax(TensorView weights, TensorView ids, TensorView gating, bool renormalize, int64_t stream) {
  check_ndim(gating, "gating_output", 2, "[num_tokens, num_experts]");
  check_float(gating, "gating_output");
  check_last_dim_contiguous(gating, "gating_output");
  LLMK_CHECK(gating.size(1) >= 1, ValueError, "gating_output: needs at least one expert, got shape ",
             shape_str(gating));
  check_ndim(ids, "topk_ids", 2, "[num_tokens, topk]");
  LLMK_CHECK(ids.size(1) >= 1 && ids.size(1) <= gating.size(1), ValueError, "topk: must be in [1, num_experts=",
             gating.size(1), "], got ", ids.size(1));
  check_shape(ids, "topk_ids", {gating.size(0), -1}, "[num_tokens, topk]");
  check_dtype(ids, "topk_ids", DType::I32);
  check_contiguous(ids, "topk_ids");
  check_shape(weights, "topk_weights", {gating.size(0), ids.size(1)}, "[num_tokens, topk]");
  check_dtype(weights, "topk_weights", DType::F32);
  check_contiguous(weights, "topk_weights");
  check_same_device(gating, "gating_output", ids, "topk_ids");
  check_same_device(gating, "gating_output", weights, "topk_weights");
  if (gating.size(0) == 0) return;
  LLMK_RUN(gating, topk_softmax, weights, ids, gating, renormalize, stream);
}

void moe_align_block_size(TensorView topk_ids, int64_t num_experts, int64_t block_size, TensorView sorted_ids,
                          TensorView expert_ids, TensorView num_post_pad, int64_t stream) {
  LLMK_CHECK(num_experts >= 1 && num_experts <= kMaxExperts, ValueError, "num_experts: must be in [1, ",
             kMaxExperts, "], got ", num_experts);
  LLMK_CHECK(block_size >= 1 && block_size <= 4096, ValueError, "block_size: must be in [1, 4096], got ", block_size);
  check_ndim(topk_ids, "topk_ids", 2, "[num_tokens, topk]");
  check_dtype(topk_ids, "topk_ids", DType::I32);
  check_contiguous(topk_ids, "topk_ids");
  check_index_range(topk_ids, "topk_ids", 0, num_experts, "experts (num_experts)", true);
  const int64_t n = topk_ids.numel(), n_sorted = n + num_experts * (block_size - 1);
  LLMK_CHECK(n_sorted <= INT32_MAX, ValueError, "topk_ids: too many entries for int32 pair ids");
  const char* names[] = {"sorted_token_ids", "expert_ids", "num_tokens_post_pad"};
  const TensorView* outs[] = {&sorted_ids, &expert_ids, &num_post_pad};
  for (int i = 0; i < 3; ++i) {
    check_dtype(*outs[i], names[i], DType::I32);
    check_contiguous(*outs[i], names[i]);
    check_same_device(topk_ids, "topk_ids", *outs[i], names[i]);
  }
  check_shape(sorted_ids, "sorted_token_ids", {n_sorted}, "[numel + num_experts * (block_size - 1)]");
  check_shape(expert_ids, "expert_ids", {(n_sorted + block_size - 1) / block_size}, "[ceil(len(sorted_token_ids) / block_size)]");
  check_shape(num_post_pad, "num_tokens_post_pad", {1}, "[1]");
  LLMK_RUN(topk_ids, moe_align_block_size, topk_ids, nullptr, num_experts, block_size, sorted_ids, expert_ids,
           num_post_pad, stream);
}

void fused_moe(TensorView out, TensorView x, TensorView w13, TensorView w2, TensorView topk_weights,
               TensorView topk_ids, std::optional<TensorView> expert_map, std::optional<TensorView> workspace,
               int64_t stream) {
  check_ndim(w13, "w13", 3, "[num_experts, 2 * intermediate_size, hidden_size]");
  check_ndim(w2, "w2", 3, "[num_experts, hidden_size, intermediate_size]");
  const int64_t E = w13.size(0), H = w2.size(1), I = w2.size(2);
  LLMK_CHECK(E >= 1 && E <= kMaxExperts, ValueError, "w13: number of experts must be in [1, ", kMaxExperts,
             "], got ", E);
  LLMK_CHECK(I >= 1 && H >= 1, ValueError, "w2: hidden_size and intermediate_size must be positive, got shape ",
             shape_str(w2));
  check_shape(w13, "w13", {E, 2 * I, H}, "[num_experts, 2 * intermediate_size, hidden_size] (from w2)");
  check_hidden(out, x, H);
  check_same_dtype(x, "hidden_states", w13, "w13");
  check_same_dtype(x, "hidden_states", w2, "w2");
  check_same_device(x, "hidden_states", w13, "w13");
  check_same_device(x, "hidden_states", w2, "w2");
  check_contiguous(w13, "w13");
  check_contiguous(w2, "w2");
  check_routing(x, topk_weights, topk_ids, expert_map, E);
  const TensorView* ws = workspace ? &*workspace : nullptr;
  check_out_alone(out, {{&x, "hidden_states"}, {&w13, "w13"}, {&w2, "w2"}, {&topk_weights, "topk_weights"},
                        {&topk_ids, "topk_ids"}, {expert_map ? &*expert_map : nullptr, "expert_map"}, {ws, "workspace"}});
  if (x.is_cuda() || kSimt) {
    LLMK_CHECK(ws != nullptr, ValueError, "workspace: the CUDA kernels need one (fused_moe_workspace_bytes)");
    check_contiguous(*ws, "workspace");
    check_same_device(x, "hidden_states", *ws, "workspace");
    const int64_t need = fused_moe_workspace_bytes(topk_ids.numel(), E, H, I, int64_t(x.elem_size()));
    LLMK_CHECK(int64_t(ws->numel() * ws->elem_size()) >= need, ValueError, "workspace: needs ", need,
               " bytes, got ", ws->numel() * ws->elem_size());
  }
  if (x.size(0) == 0) return;
  LLMK_RUN(x, fused_moe, out, x, w13, w2, topk_weights, topk_ids, expert_map ? &*expert_map : nullptr, ws, stream);
}

void fused_moe_packed(TensorView out, TensorView x, TensorView w13_packed, TensorView w2_packed, int64_t inter,
                      TensorView topk_weights, TensorView topk_ids, std::optional<TensorView> expert_map,
                      int64_t stream) {
  // fp32 panels [E, ceil(N / 16), K, 16] (gemm_cpu.h), or bf16 panels in k pairs
  // [E, ceil(N / 16), ceil(K / 2), 16, 2] (gemm_bf16_cpu.h; w13's gate and up panels interleaved)
  const bool bf16 = w13_packed.dtype == DType::BF16;
  if (bf16) {
    check_ndim(w13_packed, "w13", 5, "[num_experts, 2 * ceil(intermediate_size / 16), ceil(hidden_size / 2), 16, 2] (bf16 packed)");
    check_ndim(w2_packed, "w2", 5, "[num_experts, ceil(hidden_size / 16), ceil(intermediate_size / 2), 16, 2] (bf16 packed)");
  } else {
    check_ndim(w13_packed, "w13", 4, "[num_experts, ceil(2 * intermediate_size / 16), hidden_size, 16] (packed)");
    check_ndim(w2_packed, "w2", 4, "[num_experts, ceil(hidden_size / 16), intermediate_size, 16] (packed)");
  }
  // bf16 panels hold ceil(H / 2) k pairs: H itself comes from hidden_states, checked against them
  const int64_t E = w13_packed.size(0), H = bf16 ? x.size(-1) : w13_packed.size(2);
  if (bf16)
    LLMK_CHECK(x.ndim == 2 && (H + 1) / 2 == w13_packed.size(2), ValueError, "hidden_states: expected [num_tokens, ",
               "hidden_size] with ceil(hidden_size / 2) = ", w13_packed.size(2), " (w13's k pairs), got shape ",
               shape_str(x));
  LLMK_CHECK(E >= 1 && E <= kMaxExperts, ValueError, "w13: number of experts must be in [1, ", kMaxExperts,
             "], got ", E);
  LLMK_CHECK(inter >= 1 && H >= 1, ValueError, "intermediate_size: must be positive, got ", inter);
  if (bf16) {
    check_shape(w13_packed, "w13", {E, 2 * ((inter + 15) / 16), (H + 1) / 2, 16, 2},
                "bf16 packed [E, 2 ceil(I / 16), ceil(H / 2), 16, 2]");
    check_shape(w2_packed, "w2", {E, (H + 15) / 16, (inter + 1) / 2, 16, 2}, "bf16 packed [E, ceil(H / 16), ceil(I / 2), 16, 2]");
    check_dtype(x, "hidden_states", DType::BF16);  // the bf16 GEMM reads x as it is
  } else {
    check_shape(w13_packed, "w13", {E, (2 * inter + 15) / 16, H, 16}, "packed [E, ceil(2I / 16), H, 16]");
    check_shape(w2_packed, "w2", {E, (H + 15) / 16, inter, 16}, "packed [E, ceil(H / 16), I, 16]");
  }
  for (auto* w : {&w13_packed, &w2_packed}) {
    const char* name = w == &w13_packed ? "w13" : "w2";
    check_dtype(*w, name, bf16 ? DType::BF16 : DType::F32);
    check_on_cpu(*w, name);
    check_contiguous(*w, name);
  }
  check_hidden(out, x, H);
  check_on_cpu(x, "hidden_states");
  check_routing(x, topk_weights, topk_ids, expert_map, E);
  check_out_alone(out, {{&x, "hidden_states"}, {&w13_packed, "w13"}, {&w2_packed, "w2"},
                        {&topk_weights, "topk_weights"}, {&topk_ids, "topk_ids"},
                        {expert_map ? &*expert_map : nullptr, "expert_map"}});
  if (x.size(0) == 0) return;
  LLMK_RUN_CPU(x, fused_moe_packed, out, x, w13_packed, w2_packed, inter, topk_weights, topk_ids,
               expert_map ? &*expert_map : nullptr, stream);
}

}  // namespace llmk
