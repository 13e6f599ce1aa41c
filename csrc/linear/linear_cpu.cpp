// CPU projections. linear_small_m: a GEMV for decode, each weight row streamed from memory once and
// dotted with every row of x while it is in L1; threads split the output features.
// linear_packed: the register-tiled GEMM of gemm_cpu.h on weights packed at load time;
// linear_packed_silu_mul: the same with the MLP's gated SiLU as the epilogue. bf16 x with weights
// packed in k pairs run gemm_bf16_cpu.h's GEMM instead (gemm_bf16_amx_cpu.h's on AMX tiles).
#include <vector>

#include "common/checks.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"
#include "linear/gemm_bf16_amx_cpu.h"
#include "linear/gemm_bf16_cpu.h"
#include "linear/gemm_cpu.h"
#include "linear/linear.h"

LLMK_NS_BEGIN

namespace {


constexpr int kMaxM = 16;

// One weight row at a time, read front to back: a single sequential stream per thread is what
// the hardware prefetchers follow best (interleaving four rows ran ~30% below the read bandwidth).
// The row stays in L1 while it is dotted with every row of x, four rows of x at a time.
template <DType DT, typename T = vec::elem_t<DT>>
void gemv_rows(const T* x, int64_t ldx, int64_t M, const T* w, int64_t ldw, int64_t K,
               const T* bias, T* out, int64_t N, int64_t n0, int64_t n1) {
  float xf[kMaxM][512];
  const bool stage = K <= 512;  // x converted to fp32 once per task when it fits on the stack
  if (stage)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xf[m][k] = vec::to_f32<DT>(x[m * ldx + k]);
  auto xrow = [&](int64_t m) { return x + m * ldx; };  // unstaged rows
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = w + n * ldw;
    const float b = bias ? vec::to_f32<DT>(bias[n]) : 0.f;
    int64_t m = 0;
    // four rows of x per pass over the weight row: four independent FMA chains
    for (; m + 4 <= M; m += 4) {
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
      if (stage) {
        const float *x0 = xf[m], *x1 = xf[m + 1], *x2 = xf[m + 2], *x3 = xf[m + 3];
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          const float wv = vec::to_f32<DT>(wr[k]);
          s0 += x0[k] * wv;
          s1 += x1[k] * wv;
          s2 += x2[k] * wv;
          s3 += x3[k] * wv;
        }
      } else {
        const T *x0 = xrow(m), *x1 = xrow(m + 1), *x2 = xrow(m + 2), *x3 = xrow(m + 3);
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          const float wv = vec::to_f32<DT>(wr[k]);
          s0 += vec::to_f32<DT>(x0[k]) * wv;
          s1 += vec::to_f32<DT>(x1[k]) * wv;
          s2 += vec::to_f32<DT>(x2[k]) * wv;
          s3 += vec::to_f32<DT>(x3[k]) * wv;
        }
      }
      out[m * N + n] = vec::from_f32<DT>(s0 + b);
      out[(m + 1) * N + n] = vec::from_f32<DT>(s1 + b);
      out[(m + 2) * N + n] = vec::from_f32<DT>(s2 + b);
      out[(m + 3) * N + n] = vec::from_f32<DT>(s3 + b);
    }
    for (; m < M; ++m) {
      float s = 0.f;
      if (stage) {
        const float* xm = xf[m];
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += xm[k] * vec::to_f32<DT>(wr[k]);
      } else {
        const T* xm = xrow(m);
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += vec::to_f32<DT>(xm[k]) * vec::to_f32<DT>(wr[k]);
      }
      out[m * N + n] = vec::from_f32<DT>(s + b);
    }
  }
}

template <DType DT, typename T = vec::elem_t<DT>>
void run(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& out) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const T* xp = x.ptr<const T>();
  const T* wp = weight.ptr<const T>();
  const T* bp = bias ? bias->ptr<const T>() : nullptr;
  T* op = out.ptr<T>();
  // >= 64 weight rows per task keeps the pool's wake-up cost small.
  parallel_for(N, 64, [&](int64_t r0, int64_t r1) {
    gemv_rows<DT>(xp, x.stride(0), M, wp, weight.stride(0), K, bp, op, N, r0, r1);
  });
}

// The bf16 GEMM (plain or gated) into out (gemm_bf16_run: AMX tiles or the vdpbf16ps / widening ones).
void run_bf16(const TensorView& x, const TensorView& packed, int64_t N, const TensorView* bias, bool gated,
              const TensorView& out) {
  const bool f32 = out.dtype == DType::F32;  // fp32 rows holding the bf16 results (linear_packed's logits)
  gemm::gemm_bf16_run(x.ptr<const uint16_t>(), x.stride(0), x.size(0), x.size(1), packed.ptr<const uint16_t>(), N,
                      bias ? bias->ptr<const uint16_t>() : nullptr, gated, f32 ? nullptr : out.ptr<uint16_t>(),
                      out.stride(0), f32 ? out.ptr<float>() : nullptr);
}

}  // namespace

namespace gemm {
bool bf16_dot() {
#if defined(__AVX512F__)
  static const bool v = cpu_avx512_bf16("LLMKERN_LINEAR_BF16_DOT");
  return v;
#else
  return false;
#endif
}
}  // namespace gemm

void linear_small_m(const TensorView& x, const TensorView& weight, const TensorView* bias,
                    const TensorView& out, int64_t /*stream*/) {
  vec::dispatch_elem(x.dtype, [&](auto tag) { run<decltype(tag)::value>(x, weight, bias, out); });
}

void linear_packed(const TensorView& x, const TensorView& weight_packed, int64_t out_features,
                   const TensorView* bias, const TensorView& out, int64_t /*stream*/) {
  if (x.dtype == DType::BF16) return run_bf16(x, weight_packed, out_features, bias, false, out);
  const int64_t M = x.size(0), K = x.size(1);
  if (K == 0) {  // an empty sum: the bias (or zeros), as F.linear gives
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < out_features; ++n) out.ptr<float>()[m * out.stride(0) + n] = bias ? bias->ptr<const float>()[n] : 0.f;
    return;
  }
  thread_local std::vector<float> xpack;  // grows to the largest x seen; reused across calls
  const size_t need = size_t((M + gemm::MR - 1) / gemm::MR) * gemm::MR * size_t(K);
  if (xpack.size() < need) xpack.resize(need);
  gemm::gemm_packed(x.ptr<const float>(), x.stride(0), M, K, weight_packed.ptr<const float>(), out_features,
                    bias ? bias->ptr<const float>() : nullptr, out.ptr<float>(), out.stride(0), xpack.data());
}

void linear_packed_silu_mul(const TensorView& x, const TensorView& weight_pairs, int64_t out_features,
                            const TensorView& out, int64_t /*stream*/) {
  if (x.dtype == DType::BF16) return run_bf16(x, weight_pairs, out_features, nullptr, true, out);
  const int64_t M = x.size(0), K = x.size(1);
  if (K == 0) {  // gate = up = 0: silu(0) * 0
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < out_features; ++n) out.ptr<float>()[m * out.stride(0) + n] = 0.f;
    return;
  }
  thread_local std::vector<float> xpack;
  const size_t need = size_t((M + gemm::MR - 1) / gemm::MR) * gemm::MR * size_t(K);
  if (xpack.size() < need) xpack.resize(need);
  gemm::gemm_packed_silu_mul(x.ptr<const float>(), x.stride(0), M, K, weight_pairs.ptr<const float>(), out_features,
                             out.ptr<float>(), out.stride(0), xpack.data());
}

void packed_weight_rows(const TensorView& weight_packed, const TensorView& indices, const TensorView& out,
                        int64_t /*stream*/) {
  const int64_t T = indices.size(0), K = out.size(1);
  if (weight_packed.dtype == DType::BF16) {  // k pairs: W[n][k] at [n / 16][k / 2][n % 16][k % 2]
    const uint16_t* w = weight_packed.ptr<const uint16_t>();
    const int64_t KH = weight_packed.size(1);
    uint16_t* o = out.ptr<uint16_t>();
    parallel_for(T, 64, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = ::llmk::index_at(indices, t);
        const uint16_t* src = w + (n / gemm::PW) * KH * 2 * gemm::PW + n % gemm::PW * 2;
        for (int64_t k = 0; k < K; ++k) o[t * K + k] = src[k / 2 * 2 * gemm::PW + k % 2];
      }
    });
    return;
  }
  const float* w = weight_packed.ptr<const float>();
  float* o = out.ptr<float>();
  parallel_for(T, 64, [&](int64_t t0, int64_t t1) {  // a row is K strided loads: 64 rows per task
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = ::llmk::index_at(indices, t);
      const float* src = w + (n / gemm::PW) * K * gemm::PW + n % gemm::PW;
      for (int64_t k = 0; k < K; ++k) o[t * K + k] = src[k * gemm::PW];
    }
  });
}

LLMK_NS_END
