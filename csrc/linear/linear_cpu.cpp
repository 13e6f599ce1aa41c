// CPU GEMV for decode: each weight row is streamed from memory once and dotted with every row of
// x while it is in L1; threads split the output features.
#include "attention/attn_vec_cpu.h"  // scalar bf16 conversions shared with the attention kernels
#include "common/parallel.h"
#include "linear/linear.h"

LLMK_NS_BEGIN

namespace {

template <typename T> inline float load(T v) { return static_cast<float>(v); }
template <> inline float load<uint16_t>(uint16_t v) { return attn::bf16_to_f32(v); }
template <typename T> inline T store(float v) { return static_cast<T>(v); }
template <> inline uint16_t store<uint16_t>(float v) { return attn::f32_to_bf16(v); }

constexpr int kMaxM = 16;

// Four weight rows at a time: four independent accumulator chains per x row hide FMA latency.
template <typename T>
void gemv_rows(const T* x, int64_t ldx, int64_t M, const T* w, int64_t ldw, int64_t K,
               const T* bias, T* out, int64_t N, int64_t n0, int64_t n1) {
  float xf[kMaxM][512];
  const bool stage = K <= 512;  // x converted to fp32 once per task when it fits on the stack
  if (stage)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xf[m][k] = load<T>(x[m * ldx + k]);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const T* w0 = w + n * ldw;
    const T* w1 = w0 + ldw;
    const T* w2 = w1 + ldw;
    const T* w3 = w2 + ldw;
    for (int64_t m = 0; m < M; ++m) {
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
      if (stage) {
        const float* xm = xf[m];
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          const float xv = xm[k];
          s0 += xv * load<T>(w0[k]);
          s1 += xv * load<T>(w1[k]);
          s2 += xv * load<T>(w2[k]);
          s3 += xv * load<T>(w3[k]);
        }
      } else {
        const T* xm = x + m * ldx;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          const float xv = load<T>(xm[k]);
          s0 += xv * load<T>(w0[k]);
          s1 += xv * load<T>(w1[k]);
          s2 += xv * load<T>(w2[k]);
          s3 += xv * load<T>(w3[k]);
        }
      }
      const float s[4] = {s0, s1, s2, s3};
      for (int j = 0; j < 4; ++j)
        out[m * N + n + j] = store<T>(s[j] + (bias ? load<T>(bias[n + j]) : 0.f));
    }
  }
  for (; n < n1; ++n) {
    const T* wr = w + n * ldw;
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < K; ++k) s += load<T>(x[m * ldx + k]) * load<T>(wr[k]);
      out[m * N + n] = store<T>(s + (bias ? load<T>(bias[n]) : 0.f));
    }
  }
}

template <typename T>
void run(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& out) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const T* xp = x.ptr<const T>();
  const T* wp = weight.ptr<const T>();
  const T* bp = bias ? bias->ptr<const T>() : nullptr;
  T* op = out.ptr<T>();
  // Chunks of whole 4-row groups; >= 64 rows per task keeps the pool's wake-up cost small.
  const int64_t groups = (N + 3) / 4;
  parallel_for(groups, 16, [&](int64_t g0, int64_t g1) {
    gemv_rows<T>(xp, x.stride(0), M, wp, weight.stride(0), K, bp, op, N, g0 * 4, std::min(N, g1 * 4));
  });
}

}  // namespace

void linear_small_m(const TensorView& x, const TensorView& weight, const TensorView* bias,
                    const TensorView& out, int64_t /*stream*/) {
  switch (x.dtype) {
    case DType::F32: run<float>(x, weight, bias, out); break;
    case DType::BF16: run<uint16_t>(x, weight, bias, out); break;
    default: run<_Float16>(x, weight, bias, out); break;
  }
}

LLMK_NS_END
