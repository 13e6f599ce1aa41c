// CUDA kernel of chain speculative sampling: one CTA per request. Every thread evaluates the
// acceptance tests of the draft chain (a few Philox draws), then the CTA draws the final token from
// normalised relu(p - q) at the first rejection, or from the last target row when every draft was
// accepted (the rules and draw numbers of sampling_math.h, as in speculative_cpu.cpp).
#include "common/device_memory.h"
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"
#include "sampling/sampling_launch.cuh"

namespace llmk {
namespace gpu {

namespace {

using namespace samp;

// Weights p (mode 0), relu(p - q) (mode 1) or p with q one-hot at `tok` (mode 2).
struct ResidualSrc {
  static constexpr int N = RowLoader<float>::N;
  RowLoader<float> p, q;
  int mode;
  int64_t tok;

  LLMK_DEVICE int64_t nvec() const { return p.nvec(); }
  LLMK_DEVICE void load(int64_t v, float (&w)[N]) const {
    p.load(v, w);
    if (mode == 1) {
      float wq[N];
      q.load(v, wq);
#pragma unroll
      for (int i = 0; i < N; ++i) w[i] = spec_residual(w[i], wq[i]);
    } else if (mode == 2) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (v * N + i == tok) w[i] = spec_residual(w[i], 1.0f);
    }
  }
};

struct SpecK {
  const float* draft;  // null: one-hot drafts
  int64_t ds0, ds1;
  const void* ids;
  int ids64;
  const float* target;
  int64_t ts0, ts1;
  int64_t n, V;
  int32_t* out;
  void* accepted;
  int acc64;
  void* emitted;
  int emi64;
  DParam seed, offset;
};

LLMK_DEVICE void add_count(void* c, bool is64, int64_t b, int64_t v) {
  if (is64) static_cast<int64_t*>(c)[b] += v;
  else static_cast<int32_t*>(c)[b] += static_cast<int32_t>(v);
}

// Draws from the residual (falls back to p when the residual has no mass; token 0 when neither has).
LLMK_DEVICE int64_t draw_residual(const float* p, const float* q, int mode, int64_t tok, int64_t V, float u,
                                  RowSmem& sm) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool plain = attempt == 1 || mode == 0;
    const ResidualSrc src{RowLoader<float>(p, V), RowLoader<float>(q ? q : p, V), plain ? 0 : mode, tok};
    Stats st[1];
    const float zero = 0.0f;
    row_stats<1, false>(src, &zero, st, sm);
    const double total = st[0].mass;
    if (total > 0.0 && total != static_cast<double>(INFINITY)) {
      const Pick pk = row_select(src, 0.0f, INFINITY, static_cast<double>(u) * total, sm);
      if (pk.pos >= 0) return pk.pos;
    }
    if (plain) break;
  }
  return 0;
}

__global__ void __launch_bounds__(kMaxThreads) chain_speculative_kernel(SpecK a) {
  __shared__ RowSmem sm;
  const int64_t b = blockIdx.x, n = a.n;
  const RowRng rng = RowRng::make(a.seed.u64(b), a.offset.u64(b), static_cast<uint32_t>(b));
  int64_t indep = 0, first_reject = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = read_index(a.ids, a.ids64 != 0, b * n + i);
    const bool in_vocab = d >= 0 && d < a.V;  // checked by the front on the host / in debug mode
    const float q = a.draft && in_vocab ? a.draft[b * a.ds0 + i * a.ds1 + d] : 1.0f;
    const float p = in_vocab ? a.target[b * a.ts0 + i * a.ts1 + d] : 0.0f;
    const bool ok = spec_accepts(rng.uniform(static_cast<uint32_t>(i)), q, p);
    indep += ok ? 1 : 0;
    if (!ok && first_reject < 0) first_reject = i;
  }
  const int64_t m = first_reject < 0 ? n : first_reject;  // emitted draft tokens
  const float u = rng.uniform(spec_final_draw(n));
  int64_t last;
  if (first_reject < 0) {
    last = draw_residual(a.target + b * a.ts0 + n * a.ts1, nullptr, 0, -1, a.V, u, sm);
  } else if (a.draft) {
    last = draw_residual(a.target + b * a.ts0 + m * a.ts1, a.draft + b * a.ds0 + m * a.ds1, 1, -1, a.V, u, sm);
  } else {
    const int64_t d = read_index(a.ids, a.ids64 != 0, b * n + m);
    last = draw_residual(a.target + b * a.ts0 + m * a.ts1, nullptr, 2, d, a.V, u, sm);
  }
  if (threadIdx.x == 0) {
    int32_t* o = a.out + b * (n + 1);
    for (int64_t i = 0; i < m; ++i) o[i] = static_cast<int32_t>(read_index(a.ids, a.ids64 != 0, b * n + i));
    o[m] = static_cast<int32_t>(last);
    for (int64_t i = m + 1; i <= n; ++i) o[i] = -1;
    add_count(a.accepted, a.acc64 != 0, b, indep);
    add_count(a.emitted, a.emi64 != 0, b, m);
  }
}

}  // namespace

void chain_speculative(const SpecArgs& a) {
  SpecK k;
  k.draft = a.draft_probs ? a.draft_probs->ptr<const float>() : nullptr;
  k.ds0 = a.draft_probs ? a.draft_probs->stride(0) : 0;
  k.ds1 = a.draft_probs ? a.draft_probs->stride(1) : 0;
  k.ids = a.draft_ids.data;
  k.ids64 = a.draft_ids.dtype == DType::I64;
  k.target = a.target_probs.ptr<const float>();
  k.ts0 = a.target_probs.stride(0);
  k.ts1 = a.target_probs.stride(1);
  k.n = a.target_probs.size(1) - 1;
  k.V = a.target_probs.size(2);
  k.out = a.out.ptr<int32_t>();
  k.accepted = a.accepted.data;
  k.acc64 = a.accepted.dtype == DType::I64;
  k.emitted = a.emitted.data;
  k.emi64 = a.emitted.dtype == DType::I64;
  k.seed = dparam(a.seed);
  k.offset = dparam(a.offset);
  const unsigned grid = static_cast<unsigned>(a.target_probs.size(0));
  LLMK_LAUNCH(chain_speculative_kernel, grid, row_threads(k.V, 4), 0, a.stream)(k);
  check_launch("chain_speculative_sampling");
}

}  // namespace gpu
}  // namespace llmk
