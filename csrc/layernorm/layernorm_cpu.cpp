// CPU kernels of the layernorm family: rows in parallel (a decode step's single row runs inline),
// each row in two vectorised passes (sum of squares, then scale).
#include "common/vec_cpu.h"
#include "common/exp_cpu.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "layernorm/layernorm.h"
#include "layernorm/norm_math.h"

LLMK_NS_BEGIN

namespace {

template <DType DT, typename T = vec::elem_t<DT>> inline float round_to(float v) { return vec::to_f32<DT>(vec::from_f32<DT>(v)); }

// ~64 KB of row data per task keeps the pool's wake-up cost small next to the work.
inline int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)); }

// kCvt (bf16, vec::store_bf16): the bf16 roundings in explicit vectors by vcvtneps2bf16, the same
// bits as the compiler-vectorised loops' software rounding, which took most of a bf16 row's time.
template <DType DT, bool kCvt = false, typename T = vec::elem_t<DT>>
void norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) {
    const float v = vec::to_f32<DT>(x[i]);
    ss += v * v;
  }
  const float inv = rms_inv(ss, static_cast<int>(n), eps);
  int64_t i0 = 0;
  if constexpr (kCvt) {
    for (; i0 + vec::VL <= n; i0 += vec::VL) {
      const vec::vf h = vec::round_bf16<true>(vec::load<DT>(x + i0) * inv);
      vec::store_bf16<true>(out + i0, h * vec::load<DT>(w + i0));
    }
  }
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) out[i] = vec::from_f32<DT>(round_to<DT>(vec::to_f32<DT>(x[i]) * inv) * vec::to_f32<DT>(w[i]));
}

// f(bool_constant<kCvt>): kCvt where DT is bf16 and the CPU rounds to bf16 in hardware.
template <DType DT, typename F>
void with_cvt(F&& f) {
#if defined(__AVX512F__)
  if constexpr (DT == DType::BF16)
    if (cpu_bf16_cvt()) return f(std::true_type{});
#endif
  f(std::false_type{});
}

template <DType DT, typename T = vec::elem_t<DT>>
void run_rms_norm(const TensorView& out, const TensorView& in, const TensorView& weight, float eps) {
  const int64_t rows = in.size(0), n = in.size(1);
  const T* w = weight.ptr<const T>();
  with_cvt<DT>([&](auto cvt) {
    parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        norm_row<DT, decltype(cvt)::value>(out.ptr<T>() + r * out.stride(0), in.ptr<const T>() + r * in.stride(0), w, n, eps);
    });
  });
}

template <DType DT, typename T = vec::elem_t<DT>>
void run_fused_add(const TensorView& in, const TensorView& res, const TensorView& weight, float eps) {
  const int64_t rows = in.size(0), n = in.size(1);
  const T* w = weight.ptr<const T>();
  with_cvt<DT>([&](auto cvt) {
    constexpr bool kCvt = decltype(cvt)::value;
    parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        T* x = in.ptr<T>() + r * in.stride(0);
        T* h = res.ptr<T>() + r * res.stride(0);
        int64_t i0 = 0;
        if constexpr (kCvt)
          for (; i0 + vec::VL <= n; i0 += vec::VL) vec::store_bf16<true>(h + i0, vec::load<DT>(x + i0) + vec::load<DT>(h + i0));
#pragma omp simd
        for (int64_t i = i0; i < n; ++i) h[i] = vec::from_f32<DT>(vec::to_f32<DT>(x[i]) + vec::to_f32<DT>(h[i]));
        norm_row<DT, kCvt>(x, h, w, n, eps);
      }
    });
  });
}

template <DType DT, typename T = vec::elem_t<DT>>
void run_silu_and_mul(const TensorView& out, const TensorView& in) {
  const int64_t rows = in.size(0), d = out.size(1);
  parallel_for(rows, row_grain(2 * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* g = in.ptr<const T>() + r * in.stride(0);
      silu_mul_row<DT>(g, g + d, out.ptr<T>() + r * out.stride(0), d);
    }
  });
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight, float eps,
              int64_t /*stream*/) {
  vec::dispatch_elem(input.dtype, [&](auto tag) { run_rms_norm<decltype(tag)::value>(out, input, weight, eps); });
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView& weight,
                        float eps, int64_t /*stream*/) {
  vec::dispatch_elem(input.dtype, [&](auto tag) { run_fused_add<decltype(tag)::value>(input, residual, weight, eps); });
}

void silu_and_mul(const TensorView& out, const TensorView& input, int64_t /*stream*/) {
  vec::dispatch_elem(input.dtype, [&](auto tag) { run_silu_and_mul<decltype(tag)::value>(out, input); });
}

LLMK_NS_END
