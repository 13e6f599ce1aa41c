// Branch-free fp32 exp for the CPU kernels' vectorised loops (libm's expf is a call per element
// that stops the loop from vectorising).
#pragma once
#include <cstdint>
#include <cstring>

#include <type_traits>

#include "common/macros.h"
#include "common/vec_cpu.h"

LLMK_NS_BEGIN

// exp2_nonpos_n's polynomial for 2^g, |g| <= 1/2: the coefficients from the highest power down.
constexpr float kExp2Poly[6] = {1.3264727e-3f, 9.671513e-3f, 5.5507336e-2f, 2.4022242e-1f, 6.931470e-1f, 1.0f};

// 2^x for x <= 0 (-inf and NaN -> 0; 0 below 2^-126): x = n + g with n = round(x) and
// |g| <= 1/2, 2^g by a degree-5 polynomial fitted for relative error (within 1.5 ulp in fp32,
// exactly 1 at 0), 2^n from the bits of the rounding sum (x + 1.5 * 2^23 holds n in its low
// mantissa bits: no float-to-int conversion). Branch free; one template for a float and for a
// vector of them (vec::vf), so explicitly vectorised loops get the scalar loop's bits. N values at
// once, step by step: the polynomial is a chain of dependent FMAs, and interleaving N chains lets
// the core overlap them. Callers that scale their argument anyway fold log2(e) into that factor
// (one multiply less per vector).
template <int N, typename V>
LLMK_ALWAYS_INLINE void exp2_nonpos_n(const V* x, V* out) {
#if defined(__AVX512F__)
  // One AVX-512 vector: n by vrndscaleps (round to nearest even, as the rounding sum), 2^n applied by
  // vscalefps, and the lanes below -126 (and NaN) zeroed by its mask: 12 instructions where the
  // portable form below takes 16, with the same bits (p * 2^n rounds once either way).
  if constexpr (std::is_same_v<V, vec::vf> && vec::VL == 16) {
    const __m512 lo = _mm512_set1_ps(-126.0f);
    __m512 n[N], g[N], p[N];
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) {
      n[k] = _mm512_maskz_roundscale_ps(__mmask16(0xFFFF), __m512(x[k]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      g[k] = _mm512_sub_ps(__m512(x[k]), n[k]);
      p[k] = _mm512_set1_ps(kExp2Poly[0]);
    }
#pragma GCC unroll 5
    for (int c = 1; c < 6; ++c) {
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) p[k] = _mm512_fmadd_ps(p[k], g[k], _mm512_set1_ps(kExp2Poly[c]));
    }
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k)
      out[k] = V(_mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(__m512(x[k]), lo, _CMP_GE_OQ), p[k], n[k]));
    return;
  }
#endif
  const V lo = V{} - 126.0f, magic = V{} + 12582912.0f;
  V r[N], g[N], p[N];
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) {
    V t;
    if constexpr (std::is_same_v<V, float>) t = x[k] > -126.0f ? x[k] : -126.0f;
    else t = vec::vmax(x[k], lo);
    r[k] = t + magic;
    g[k] = t - (r[k] - magic);
    p[k] = V{} + kExp2Poly[0];
  }
#pragma GCC unroll 5
  for (int c = 1; c < 6; ++c) {
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) p[k] = p[k] * g[k] + kExp2Poly[c];
  }
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) {
    if constexpr (std::is_same_v<V, float>) {
      uint32_t bits;
      std::memcpy(&bits, &r[k], sizeof(bits));
      bits = (bits << 23) + (127u << 23);
      float scale;
      std::memcpy(&scale, &bits, sizeof(scale));
      out[k] = x[k] >= -126.0f ? p[k] * scale : 0.0f;
    } else {
      const vec::vu scale = (reinterpret_cast<vec::vu>(r[k]) << 23) + (127u << 23);
      const vec::vi y = reinterpret_cast<vec::vi>(p[k] * reinterpret_cast<V>(scale));
      out[k] = reinterpret_cast<V>((x[k] >= lo) & y);
    }
  }
}

constexpr float kLog2e = 1.44269504088896341f;

// exp(x) for x <= 0 (-inf and NaN -> 0, 0 below e^-87.3): exp2_nonpos_n of x * log2(e); the
// rounding of the product adds up to |x| * 2^-24 to the relative error.
template <int N, typename V>
LLMK_ALWAYS_INLINE void exp_nonpos_n(const V* x, V* out) {
  V t[N];
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) t[k] = x[k] * kLog2e;
  exp2_nonpos_n<N>(t, out);
}

template <typename V>
LLMK_ALWAYS_INLINE V exp_nonpos(V x) {
  V r;
  exp_nonpos_n<1>(&x, &r);
  return r;
}

// SiLU(g) = g * sigmoid(g), with the exponential of -|g| only (no overflow, vectorises). The
// numerator is selected before the one division (a select of two quotients vectorises to two
// divisions per vector).
template <typename V>
LLMK_ALWAYS_INLINE V silu_fast(V g) {
  const V zero{}, one = V{} + 1.0f;
  const V e = exp_nonpos<V>(g < zero ? g : -g);
  return g * ((g < zero ? e : one) / (one + e));
}

// out[i] = SiLU(gate[i]) * up[i] for i < n, elements of DT: whole vectors, then the tail element
// by element (GCC left the element loop scalar). The same bits either way: silu_fast is one template
// for both, and vec::store rounds as from_f32 (fp16 has no vector store yet: element by element).
template <DType DT>
LLMK_ALWAYS_INLINE void silu_mul_row(const vec::elem_t<DT>* gate, const vec::elem_t<DT>* up, vec::elem_t<DT>* out,
                                     int64_t n) {
  int64_t i = 0;
  if constexpr (DT != DType::F16)
    for (; i + vec::VL <= n; i += vec::VL)
      vec::store<DT>(out + i, silu_fast(vec::load<DT>(gate + i)) * vec::load<DT>(up + i));
  for (; i < n; ++i) out[i] = vec::from_f32<DT>(silu_fast(vec::to_f32<DT>(gate[i])) * vec::to_f32<DT>(up[i]));
}

LLMK_NS_END
