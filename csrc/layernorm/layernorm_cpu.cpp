// CPU kernels of the layernorm family: rows in parallel (a decode step's single row runs inline),
// each row in two vectorised passes (sum of squares, then scale).
#include "common/elem_cpu.h"
#include "common/exp_cpu.h"
#include "common/parallel.h"
#include "layernorm/layernorm.h"
#include "layernorm/norm_math.h"

LLMK_NS_BEGIN

namespace {

template <typename T> inline float round_to(float v) { return load<T>(store<T>(v)); }

// ~64 KB of row data per task keeps the pool's wake-up cost small next to the work.
inline int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)); }

template <typename T>
void norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load<T>(x[i]);
    ss += v * v;
  }
  const float inv = rms_inv(ss, static_cast<int>(n), eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(round_to<T>(load<T>(x[i]) * inv) * load<T>(w[i]));
}

template <typename T>
void run_rms_norm(const TensorView& out, const TensorView& in, const TensorView& weight, float eps) {
  const int64_t rows = in.size(0), n = in.size(1);
  const T* w = weight.ptr<const T>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      norm_row<T>(out.ptr<T>() + r * out.stride(0), in.ptr<const T>() + r * in.stride(0), w, n, eps);
  });
}

template <typename T>
void run_fused_add(const TensorView& in, const TensorView& res, const TensorView& weight, float eps) {
  const int64_t rows = in.size(0), n = in.size(1);
  const T* w = weight.ptr<const T>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      T* x = in.ptr<T>() + r * in.stride(0);
      T* h = res.ptr<T>() + r * res.stride(0);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) h[i] = store<T>(load<T>(x[i]) + load<T>(h[i]));
      norm_row<T>(x, h, w, n, eps);
    }
  });
}

template <typename T>
void run_silu_and_mul(const TensorView& out, const TensorView& in) {
  const int64_t rows = in.size(0), d = out.size(1);
  parallel_for(rows, row_grain(2 * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* g = in.ptr<const T>() + r * in.stride(0);
      T* o = out.ptr<T>() + r * out.stride(0);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] = store<T>(silu_fast(load<T>(g[i])) * load<T>(g[d + i]));
    }
  });
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight, float eps,
              int64_t /*stream*/) {
  dispatch_elem(input.dtype, [&](auto* tag) { run_rms_norm<std::remove_pointer_t<decltype(tag)>>(out, input, weight, eps); });
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView& weight,
                        float eps, int64_t /*stream*/) {
  dispatch_elem(input.dtype, [&](auto* tag) { run_fused_add<std::remove_pointer_t<decltype(tag)>>(input, residual, weight, eps); });
}

void silu_and_mul(const TensorView& out, const TensorView& input, int64_t /*stream*/) {
  dispatch_elem(input.dtype, [&](auto* tag) { run_silu_and_mul<std::remove_pointer_t<decltype(tag)>>(out, input); });
}

LLMK_NS_END
