// CUDA kernel of chain speculative sampling: one CTA per request. The per-request algorithm is
// row_algo.h's spec_row (shared with the CPU kernel): every thread evaluates the acceptance tests
// (a few Philox draws), then the CTA draws the final token with the residual passes below.
#include "common/device_memory.h"
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"
#include "sampling/sampling_launch.cuh"

namespace llmk {
namespace gpu {

namespace {

using namespace samp;

// Weights p (mode 0), relu(p - q) (mode 1) or p with q one-hot at `tok` (mode 2): ResidualMode.
// With a token bitmask p is the masked target renormalised: p * allowed * inv_z.
struct ResidualSrc {
  static constexpr int N = RowLoader<float>::N;
  RowLoader<float> p, q;
  int mode;
  int64_t tok;
  float inv_z;

  LLMK_DEVICE int64_t nvec() const { return p.nvec(); }
  LLMK_DEVICE void load(int64_t v, float (&w)[N]) const {
    p.load(v, w);
    if (p.mask) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (w[i] > 0.0f) w[i] *= inv_z;  // not -inf past the end (-inf * 0 would be NaN)
    }
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
  const int32_t* bitmask;  // [b, n + 1, words] or null
  int64_t bs0, bs1;
  DParam seed, offset;
};

LLMK_DEVICE void add_count(void* c, bool is64, int64_t b, int64_t v) {
  if (is64) static_cast<int64_t*>(c)[b] += v;
  else static_cast<int32_t*>(c)[b] += static_cast<int32_t>(v);
}

// Request b as row_algo.h's speculative row. With a token bitmask the target at position i is p
// masked and renormalised, p * allowed / Z_i (Z_i: the allowed mass, one pass over the position).
struct DeviceSpecRow {
  const SpecK& a;
  int64_t b;
  RowSmem& sm;
  int64_t scaled_pos = -1;  // the position whose 1 / Z is in inv_z
  float inv_z = 1.0f;

  LLMK_DEVICE int64_t id(int64_t i) const { return read_index(a.ids, a.ids64 != 0, b * a.n + i); }
  LLMK_DEVICE bool in_vocab(int64_t d) const { return d >= 0 && d < a.V; }  // checked by the front
  LLMK_DEVICE float q(int64_t i, int64_t d) const {
    return a.draft && in_vocab(d) ? a.draft[b * a.ds0 + i * a.ds1 + d] : 1.0f;
  }
  LLMK_DEVICE const int32_t* mask(int64_t i) const { return a.bitmask ? a.bitmask + b * a.bs0 + i * a.bs1 : nullptr; }
  LLMK_DEVICE const float* target_row(int64_t i) const { return a.target + b * a.ts0 + i * a.ts1; }
  LLMK_DEVICE float p(int64_t i, int64_t d) {
    if (!in_vocab(d)) return 0.0f;
    const float pv = target_row(i)[d];
    if (!a.bitmask) return pv;
    return token_allowed(mask(i), d) ? pv * scale(i) : 0.0f;
  }
  // 1 / Z_i (0 when nothing allowed has mass); called by every thread alike (a CTA-wide pass).
  LLMK_DEVICE float scale(int64_t i) {
    if (scaled_pos == i) return inv_z;
    PivotStats st[1];
    const float zero = 0.0f;
    row_stats<1, false>(ProbsSrc<float>(target_row(i), a.V, mask(i), 0.0f), &zero, st, sm);
    const double z = st[0].mass;
    scaled_pos = i;
    inv_z = z > 0.0 && z != static_cast<double>(INFINITY) ? static_cast<float>(1.0 / z) : 0.0f;
    return inv_z;
  }
  // The final token when no weight is left: token 0 as before, -1 when a bitmask allows nothing.
  LLMK_DEVICE int64_t empty_token() const { return a.bitmask ? -1 : 0; }
  LLMK_DEVICE ResidualSrc source(int64_t m, ResidualMode mode) {
    const float* pr = target_row(m);
    const float* qr = a.draft ? a.draft + b * a.ds0 + m * a.ds1 : pr;
    const float iz = a.bitmask ? scale(m) : 1.0f;
    return ResidualSrc{RowLoader<float>(pr, a.V, mask(m), 0.0f), RowLoader<float>(qr, a.V), static_cast<int>(mode),
                       mode == ResidualMode::OneHot ? id(m) : -1, iz};
  }
  LLMK_DEVICE double residual_mass(int64_t m, ResidualMode mode) {
    PivotStats st[1];
    const float zero = 0.0f;
    row_stats<1, false>(source(m, mode), &zero, st, sm);
    return st[0].mass;
  }
  LLMK_DEVICE int64_t residual_select(int64_t m, ResidualMode mode, double target) {
    return row_select(source(m, mode), 0.0f, INFINITY, target, sm).token;
  }
};

__global__ void __launch_bounds__(kMaxThreads) chain_speculative_kernel(SpecK a) {
  __shared__ RowSmem sm;
  const int64_t b = blockIdx.x;
  const RowRng rng = RowRng::make(a.seed.u64(b), a.offset.u64(b), static_cast<uint32_t>(b));
  DeviceSpecRow sr{a, b, sm};
  const SpecResult res = spec_row(sr, a.n, a.draft != nullptr, rng);
  if (threadIdx.x == 0) {
    spec_write(sr, a.out + b * (a.n + 1), a.n, res);
    add_count(a.accepted, a.acc64 != 0, b, res.accepted);
    add_count(a.emitted, a.emi64 != 0, b, res.emitted);
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
  k.bitmask = a.bitmask ? a.bitmask->ptr<const int32_t>() : nullptr;
  k.bs0 = a.bitmask ? a.bitmask->stride(0) : 0;
  k.bs1 = a.bitmask ? a.bitmask->stride(1) : 0;
  const unsigned grid = static_cast<unsigned>(a.target_probs.size(0));
  LLMK_LAUNCH(chain_speculative_kernel, grid, row_threads(k.V, 4), 0, a.stream)(k);
  check_launch("chain_speculative_sampling");
}

}  // namespace gpu
}  // namespace llmk
