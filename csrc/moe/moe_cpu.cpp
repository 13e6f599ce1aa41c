// CPU kernels of the MoE family. fused_moe groups the (token, expert) pairs by expert on the host,
// then per expert with tokens: gather its rows (fp32), gate/up GEMM, SiLU-and-mul, down GEMM, and
// the routing-weighted add into an fp32 accumulator in token order. Experts nobody picked are never
// touched. The GEMMs are the packed-panel GEMM of csrc/linear (weights packed at load time) or, on
// weights as they are, a row-blocked kernel that streams each weight row once per call; bf16 weights
// as they are run on AMX tiles where present (moe_amx_cpu.h), else on the packed bf16 GEMM's tiles,
// packed a unit of rows at a time as they are read (moe_bf16_cpu.h).
#include <algorithm>
#include <vector>

#include "common/exp_cpu.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "linear/gemm_bf16_amx_cpu.h"
#include "linear/gemm_cpu.h"
#include "moe/moe.h"
#include "moe/moe_amx_cpu.h"
#include "moe/moe_bf16_cpu.h"
#include "moe/moe_math.h"

LLMK_NS_BEGIN

namespace {

// Pair ids (t * k + j) grouped by local expert, token order within a group.
struct Groups {
  std::vector<int64_t> offs;  // [E + 1]
  std::vector<int32_t> pairs;
};

Groups group_pairs(const TensorView& topk_ids, const TensorView* expert_map, int64_t E) {
  const int32_t* ids = topk_ids.ptr<const int32_t>();
  const int32_t* map = expert_map ? expert_map->ptr<const int32_t>() : nullptr;
  const int32_t map_size = expert_map ? int32_t(expert_map->size(0)) : 0;
  const int64_t n = topk_ids.numel();
  Groups g;
  g.offs.assign(E + 1, 0);
  std::vector<int32_t> local(n);
  for (int64_t i = 0; i < n; ++i) {
    local[i] = moe::local_expert(ids[i], map, map_size, int32_t(E));
    if (local[i] >= 0) ++g.offs[local[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) g.offs[e + 1] += g.offs[e];
  g.pairs.resize(g.offs[E]);
  std::vector<int64_t> fill(g.offs.begin(), g.offs.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (local[i] >= 0) g.pairs[fill[local[i]]++] = int32_t(i);
  return g;
}

// C [M, N] = X [M, K] (fp32) W^T with W [N, K] in its storage dtype, for few rows (decode): each
// weight row is read from memory once, front to back (one sequential stream per thread, what the
// prefetchers follow best), and dotted with four rows of X per pass while it sits in L1.
template <DType DT, typename T = vec::elem_t<DT>>
void gemm_rows(const float* X, int64_t M, int64_t K, const T* W, int64_t N, float* C) {
  parallel_for(N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* wr = W + n * K;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        const float *x0 = X + m * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          const float w = vec::to_f32<DT>(wr[k]);
          s0 += x0[k] * w;
          s1 += x1[k] * w;
          s2 += x2[k] * w;
          s3 += x3[k] * w;
        }
        C[m * N + n] = s0;
        C[(m + 1) * N + n] = s1;
        C[(m + 2) * N + n] = s2;
        C[(m + 3) * N + n] = s3;
      }
      for (; m < M; ++m) {
        const float* xm = X + m * K;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += xm[k] * vec::to_f32<DT>(wr[k]);
        C[m * N + n] = s;
      }
    }
  });
}

// W [N, K] in its storage dtype -> fp32 panels [ceil(N / 16)][K][16], gemm_cpu.h's layout (the last
// panel zero-padded): an expert with many rows on unpacked weights is packed per call, which costs
// a few reads of W and pays for itself once the GEMM, not the weight read, dominates.
template <DType DT, typename T = vec::elem_t<DT>>
void pack_panels(const T* W, int64_t N, int64_t K, float* dst) {
  parallel_for(gemm::num_panels(N), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* d = dst + p * K * gemm::PW;
      for (int j = 0; j < gemm::PW; ++j) {
        const int64_t n = p * gemm::PW + j;
        if (n < N)
          for (int64_t k = 0; k < K; ++k) d[k * gemm::PW + j] = vec::to_f32<DT>(W[n * K + k]);
        else
          for (int64_t k = 0; k < K; ++k) d[k * gemm::PW + j] = 0.f;
      }
    }
  });
}

// C [M, N] = X [M, K] W^T on packed panels (xpack: the GEMM's scratch for X, grown as needed).
inline void gemm_on_panels(const float* X, int64_t M, int64_t K, const float* panels, int64_t N, float* C,
                           std::vector<float>& xpack) {
  const size_t need = size_t((M + gemm::MR - 1) / gemm::MR) * gemm::MR * size_t(K);
  if (xpack.size() < need) xpack.resize(need);
  gemm::gemm_packed(X, K, M, K, panels, N, nullptr, C, N, xpack.data());
}

constexpr int64_t kPackRows = 32;  // from this many rows per expert, pack unpacked weights per call

LLMK_ALWAYS_INLINE float as_f32(float v) { return v; }
LLMK_ALWAYS_INLINE float as_f32(uint16_t bf16) { return vec::bf16_to_f32(bf16); }

// The loop over experts both pipelines share: for each local expert with rows, expert(e, pairs, M)
// returns its M output rows (row stride H; fp32 or bf16), which are added with their routing
// weights into an fp32 accumulator in token order; out is rounded once to its dtype.
template <DType DT, typename Expert>
void each_expert(const TensorView& out, const TensorView& x, int64_t E, const TensorView& topk_weights,
                 const TensorView& topk_ids, const TensorView* expert_map, const Expert& expert) {
  const int64_t Tn = x.size(0), H = x.size(1), k = topk_ids.size(1);
  const Groups g = group_pairs(topk_ids, expert_map, E);
  const float* tw = topk_weights.ptr<const float>();
  std::vector<float> acc(Tn * H, 0.f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = g.offs[e + 1] - g.offs[e];
    if (M == 0) continue;
    const int32_t* pairs = g.pairs.data() + g.offs[e];
    const auto* Y = expert(e, pairs, M);
    for (int64_t r = 0; r < M; ++r) {  // pairs of one token are in different groups: no races, no threads
      const float w = tw[pairs[r]];
      float* dst = acc.data() + (pairs[r] / k) * H;
      const auto* y = Y + r * H;
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) dst[h] += w * as_f32(y[h]);
    }
  }
  using T = vec::elem_t<DT>;
  T* op = out.ptr<T>();
  for (int64_t t = 0; t < Tn; ++t)
    for (int64_t h = 0; h < H; ++h) op[t * out.stride(0) + h] = vec::from_f32<DT>(acc[t * H + h]);
}

// The fp32 pipeline; gemm(e, X, M, C, which) computes C = X W^T for expert e's w13 (which 0,
// N = 2I) or w2 (which 1, N = H).
template <DType DT, typename Gemm, typename T = vec::elem_t<DT>>
void run_moe(const TensorView& out, const TensorView& x, int64_t E, int64_t I, const TensorView& topk_weights,
             const TensorView& topk_ids, const TensorView* expert_map, const Gemm& gemm) {
  const int64_t H = x.size(1), k = topk_ids.size(1);
  const T* xp = x.ptr<const T>();
  std::vector<float> X, G, A, Y;
  each_expert<DT>(out, x, E, topk_weights, topk_ids, expert_map, [&](int64_t e, const int32_t* pairs, int64_t M) {
    X.resize(M * H), G.resize(M * 2 * I), A.resize(M * I), Y.resize(M * H);
    for (int64_t r = 0; r < M; ++r) {
      const T* src = xp + (pairs[r] / k) * x.stride(0);
      for (int64_t h = 0; h < H; ++h) X[r * H + h] = vec::to_f32<DT>(src[h]);
    }
    gemm(e, X.data(), M, G.data(), 0);
    parallel_for(M, std::max<int64_t>(1, 65536 / std::max<int64_t>(I, 1)), [&](int64_t r0, int64_t r1) {
      // the dense MLP's SiLU (vectorised; libm's expf was a call per element)
      for (int64_t r = r0; r < r1; ++r) silu_mul_row<DType::F32>(&G[r * 2 * I], &G[r * 2 * I + I], &A[r * I], I);
    });
    gemm(e, A.data(), M, Y.data(), 1);
    return static_cast<const float*>(Y.data());
  });
}

// The bf16 pipeline: x rows gathered as they are; gemm(e, X, M, C, which) writes expert e's bf16
// rows C: which 0 -> the gated SiLU of gate/up [M, I] (the activations rounded to bf16, as the CUDA
// kernels and a bf16 HF model round them), which 1 -> down [M, H]. Each expert's bf16 output is
// added in fp32 with its routing weight.
template <typename Gemm>
void run_moe_bf16(const TensorView& out, const TensorView& x, int64_t E, int64_t I, const TensorView& topk_weights,
                  const TensorView& topk_ids, const TensorView* expert_map, const Gemm& gemm) {
  const int64_t H = x.size(1), k = topk_ids.size(1);
  const uint16_t* xp = x.ptr<const uint16_t>();
  std::vector<uint16_t> X, A, Y;
  each_expert<DType::BF16>(out, x, E, topk_weights, topk_ids, expert_map,
                           [&](int64_t e, const int32_t* pairs, int64_t M) {
    X.resize(M * H), A.resize(M * I), Y.resize(M * H);
    for (int64_t r = 0; r < M; ++r) std::copy_n(xp + (pairs[r] / k) * x.stride(0), H, X.data() + r * H);
    gemm(e, X.data(), M, A.data(), 0);
    gemm(e, A.data(), M, Y.data(), 1);
    return static_cast<const uint16_t*>(Y.data());
  });
}

}  // namespace

void topk_softmax(const TensorView& weights, const TensorView& ids, const TensorView& gating, bool renormalize,
                  int64_t /*stream*/) {
  const int64_t T = gating.size(0), E = gating.size(1), k = ids.size(1);
  float* w = weights.ptr<float>();
  int32_t* id = ids.ptr<int32_t>();
  vec::dispatch_elem(gating.dtype, [&](auto tag) {
    constexpr DType DT = decltype(tag)::value;
    const vec::elem_t<DT>* g = gating.ptr<const vec::elem_t<DT>>();
    parallel_for(T, std::max<int64_t>(1, 8192 / (E * k)), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const vec::elem_t<DT>* row = g + t * gating.stride(0);
        moe::softmax_topk([&](int i) { return vec::to_f32<DT>(row[i]); }, int(E), int(k), renormalize, w + t * k,
                          id + t * k);
      }
    });
  });
}

void moe_align_block_size(const TensorView& topk_ids, const TensorView* expert_map, int64_t E, int64_t B,
                          const TensorView& sorted_ids, const TensorView& expert_ids, const TensorView& num_post_pad,
                          int64_t /*stream*/) {
  const Groups g = group_pairs(topk_ids, expert_map, E);
  int32_t* s = sorted_ids.ptr<int32_t>();
  int32_t* eb = expert_ids.ptr<int32_t>();
  std::fill_n(s, sorted_ids.numel(), int32_t(topk_ids.numel()));
  std::fill_n(eb, expert_ids.numel(), -1);
  int64_t pos = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = g.offs[e + 1] - g.offs[e];
    if (n == 0) continue;
    std::copy_n(g.pairs.data() + g.offs[e], n, s + pos);
    const int64_t nb = (n + B - 1) / B;
    std::fill_n(eb + pos / B, nb, int32_t(e));
    pos += nb * B;
  }
  num_post_pad.ptr<int32_t>()[0] = int32_t(pos);
}

void fused_moe(const TensorView& out, const TensorView& x, const TensorView& w13, const TensorView& w2,
               const TensorView& topk_weights, const TensorView& topk_ids, const TensorView* expert_map,
               const TensorView* /*workspace*/, int64_t /*stream*/) {
  const int64_t E = w13.size(0), I = w2.size(2), H = x.size(1);
#if LLMK_AMX_TILES
  // bf16 experts as they are stored, on AMX tiles with the weight rows read in place (moe_amx_cpu.h):
  // the packed experts' results without packing.
  const AmxMode amx = ::llmk::amx_mode();
  if (x.dtype == DType::BF16 && amx != AmxMode::Off && H % 32 == 0 && I % 32 == 0) {
    const uint16_t* a = w13.ptr<const uint16_t>();
    const uint16_t* b = w2.ptr<const uint16_t>();
    const bool cvt = ::llmk::cpu_bf16_cvt(), emulated = amx == AmxMode::Emulated;
    std::vector<uint32_t> xt;
    return run_moe_bf16(out, x, E, I, topk_weights, topk_ids, expert_map,
                        [&](int64_t e, const uint16_t* X, int64_t M, uint16_t* C, int which) {
      const int64_t K = which == 0 ? H : I;
      xt.resize(size_t(moe_amx::xt_words(M, K)));
      moe_amx::pack_xt(X, K, M, K, xt.data());
      if (which == 0) moe_amx::gemm_wx({a + e * 2 * I * H, 2 * I, H, true, xt.data(), M, cvt, C, I}, emulated);
      else moe_amx::gemm_wx({b + e * H * I, H, I, false, xt.data(), M, cvt, C, H}, emulated);
    });
  }
#endif
  if (x.dtype == DType::BF16) {
    const uint16_t* a = w13.ptr<const uint16_t>();
    const uint16_t* b = w2.ptr<const uint16_t>();
    return run_moe_bf16(out, x, E, I, topk_weights, topk_ids, expert_map,
                        [&](int64_t e, const uint16_t* X, int64_t M, uint16_t* C, int which) {
      if (which == 0) moe_bf16::gemm_stored(X, M, H, a + e * 2 * I * H, 2 * I, true, C, I);
      else moe_bf16::gemm_stored(X, M, I, b + e * H * I, H, false, C, H);
    });
  }
  // fp32 and fp16 experts (bf16 returned above, so only these two are instantiated).
  auto run_float = [&](auto tag) {
    constexpr DType DT = decltype(tag)::value;
    using T = vec::elem_t<DT>;
    const T* a = w13.ptr<const T>();
    const T* b = w2.ptr<const T>();
    std::vector<float> panels, xpack;
    run_moe<DT>(out, x, E, I, topk_weights, topk_ids, expert_map, [&](int64_t e, const float* X, int64_t M, float* C, int which) {
      const int64_t K = which == 0 ? H : I, N = which == 0 ? 2 * I : H;
      const T* W = which == 0 ? a + e * 2 * I * H : b + e * H * I;
      if (M < kPackRows) return gemm_rows<DT>(X, M, K, W, N, C);
      panels.resize(size_t(gemm::num_panels(N)) * gemm::PW * size_t(K));
      pack_panels<DT>(W, N, K, panels.data());
      gemm_on_panels(X, M, K, panels.data(), N, C, xpack);
    });
  };
  if (x.dtype == DType::F32) run_float(vec::DTag<DType::F32>{});
  else run_float(vec::DTag<DType::F16>{});
}

void fused_moe_packed(const TensorView& out, const TensorView& x, const TensorView& w13_packed,
                      const TensorView& w2_packed, int64_t I, const TensorView& topk_weights,
                      const TensorView& topk_ids, const TensorView* expert_map, int64_t /*stream*/) {
  const int64_t E = w13_packed.size(0), H = x.size(1);
  const int64_t sa = w13_packed.numel() / E, sb = w2_packed.numel() / E;
  if (w13_packed.dtype == DType::BF16) {  // k pairs (w13: gate/up panel pairs, w2: plain panels)
    const uint16_t* a = w13_packed.ptr<const uint16_t>();
    const uint16_t* b = w2_packed.ptr<const uint16_t>();
    return run_moe_bf16(out, x, E, I, topk_weights, topk_ids, expert_map,
                        [&](int64_t e, const uint16_t* X, int64_t M, uint16_t* C, int which) {
      if (which == 0) gemm::gemm_bf16_run(X, H, M, H, a + e * sa, I, nullptr, true, C, I);
      else gemm::gemm_bf16_run(X, I, M, I, b + e * sb, H, nullptr, false, C, H);
    });
  }
  const float* a = w13_packed.ptr<const float>();
  const float* b = w2_packed.ptr<const float>();
  std::vector<float> xpack;
  auto gemm = [&](int64_t e, const float* X, int64_t M, float* C, int which) {
    if (which == 0) gemm_on_panels(X, M, H, a + e * sa, 2 * I, C, xpack);
    else gemm_on_panels(X, M, I, b + e * sb, H, C, xpack);
  };
  vec::dispatch_elem(x.dtype, [&](auto tag) {
    run_moe<decltype(tag)::value>(out, x, E, I, topk_weights, topk_ids, expert_map, gemm);
  });
}

LLMK_NS_END
