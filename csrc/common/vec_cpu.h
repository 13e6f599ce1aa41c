// The CPU kernels' numeric library: element types and conversions, SIMD vectors written with GCC
// vector extensions (one source compiles to AVX-512 (16 lanes), AVX2 (8 lanes) or SSE2 (4 lanes) in
// the three builds of each *_cpu.cpp file), loads with conversion, exp / tanh, reductions.
// Intrinsics only where the extensions have no equivalent (fp16 loads, masked tails), each with a
// portable fallback.
//
// Element types: named by DType. Elem<DT>::type is the storage type (float; uint16_t bit patterns
// for fp16 and bf16); to_f32<DT> / from_f32<DT> convert (round to nearest even); dispatch_elem
// calls f(DTag<DT>{}) for a tensor's dtype.
#pragma once
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/half_bits.h"
#include "common/macros.h"
#include "common/tensor.h"

LLMK_NS_BEGIN
namespace vec {

#if defined(__AVX512F__)
constexpr int VL = 16;
#elif defined(__AVX2__)
constexpr int VL = 8;
#else
constexpr int VL = 4;
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vf_u __attribute__((vector_size(VL * 4), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef uint16_t vh_u __attribute__((vector_size(VL * 2), aligned(2), may_alias));

LLMK_ALWAYS_INLINE vf splat(float x) {  // one broadcast (GCC turns `vf{} + x` into add + broadcast)
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#elif defined(__AVX2__)
  return _mm256_set1_ps(x);
#elif defined(__SSE__)
  return _mm_set1_ps(x);
#else
  return vf{} + x;
#endif
}
LLMK_ALWAYS_INLINE vf loadu(const float* p) { return *reinterpret_cast<const vf_u*>(p); }
LLMK_ALWAYS_INLINE void storeu(float* p, vf v) { *reinterpret_cast<vf_u*>(p) = v; }
// a > b ? a : b (and a < b ? a : b): the max/min instructions compute exactly that, NaN and signed
// zeros included, but GCC lowers the generic select to compare + blend.
LLMK_ALWAYS_INLINE vf vmax(vf a, vf b) {
#if defined(__AVX512F__)
  return _mm512_maskz_max_ps(0xffff, a, b);  // (the unmasked intrinsic trips GCC 12's -Wmaybe-uninitialized)
#elif defined(__AVX2__)
  return _mm256_max_ps(a, b);
#elif defined(__SSE__)
  return _mm_max_ps(a, b);
#else
  return a > b ? a : b;
#endif
}
LLMK_ALWAYS_INLINE vf vmin(vf a, vf b) {
#if defined(__AVX512F__)
  return _mm512_maskz_min_ps(0xffff, a, b);
#elif defined(__AVX2__)
  return _mm256_min_ps(a, b);
#elif defined(__SSE__)
  return _mm_min_ps(a, b);
#else
  return a < b ? a : b;
#endif
}

// ---- scalar conversions --------------------------------------------------------------------

LLMK_ALWAYS_INLINE float bf16_to_f32(uint16_t h) { return bf16_bits_to_f32(h); }
LLMK_ALWAYS_INLINE uint16_t f32_to_bf16(float f) { return f32_to_bf16_bits(f); }
// Through the compiler's _Float16 where it has one (it vectorises element loops with F16C /
// AVX-512 conversions), else the portable bit conversions; all round to nearest even.
LLMK_ALWAYS_INLINE float f16_to_f32(uint16_t h) {
#if defined(__FLT16_MAX__)
  return static_cast<float>(__builtin_bit_cast(_Float16, h));
#else
  return f16_bits_to_f32(h);
#endif
}
LLMK_ALWAYS_INLINE uint16_t f32_to_f16(float f) {
#if defined(__FLT16_MAX__)
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f));
#else
  return f32_to_f16_bits(f);
#endif
}

template <DType T> struct Elem;
template <> struct Elem<DType::F32> { using type = float; };
template <> struct Elem<DType::F16> { using type = uint16_t; };
template <> struct Elem<DType::BF16> { using type = uint16_t; };

template <DType T>
LLMK_ALWAYS_INLINE float to_f32(typename Elem<T>::type x) {
  if constexpr (T == DType::F32) return x;
  else if constexpr (T == DType::BF16) return bf16_to_f32(x);
  else return f16_to_f32(x);
}

template <DType T>
LLMK_ALWAYS_INLINE typename Elem<T>::type from_f32(float x) {
  if constexpr (T == DType::F32) return x;
  else if constexpr (T == DType::BF16) return f32_to_bf16(x);
  else return f32_to_f16(x);
}

template <DType T> using elem_t = typename Elem<T>::type;
template <DType T> using DTag = std::integral_constant<DType, T>;

// f(DTag<DT>{}) with DT the dtype of a float tensor (F32, F16 or BF16).
template <typename F>
LLMK_ALWAYS_INLINE void dispatch_elem(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(DTag<DType::F32>{}); break;
    case DType::BF16: f(DTag<DType::BF16>{}); break;
    default: f(DTag<DType::F16>{}); break;
  }
}

// ---- vector loads with conversion to fp32 (in registers) -----------------------------------

template <DType T>
LLMK_ALWAYS_INLINE vf load(const typename Elem<T>::type* p) {
  if constexpr (T == DType::F32) {
    return loadu(p);
  } else if constexpr (T == DType::BF16) {
#if defined(__AVX512F__)
    // One 512-bit zero-extension (GCC splits the generic form into two 256-bit halves).
    const __m512i u = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, u, 16));
#else
    const vh h = *reinterpret_cast<const vh_u*>(p);
    return reinterpret_cast<vf>(__builtin_convertvector(h, vu) << 16);
#endif
  } else {
#if defined(__AVX512F__)
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && defined(__AVX2__)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    vf r;
    for (int i = 0; i < VL; ++i) r[i] = f16_to_f32(p[i]);
    return r;
#endif
  }
}

// Loads n < VL elements (the rest zero). Only the AVX-512 build can need it (head_dim is a
// multiple of 8 = the AVX2 width).
template <DType T>
LLMK_ALWAYS_INLINE vf load_tail(const typename Elem<T>::type* p, int n) {
#if defined(__AVX512F__)
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
  if constexpr (T == DType::F32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (T == DType::BF16)
      return reinterpret_cast<vf>(__builtin_convertvector(reinterpret_cast<vh>(h), vu) << 16);
    else
      return _mm512_maskz_cvtph_ps(0xffff, h);
  }
#else
  vf r = splat(0.f);
  for (int i = 0; i < n; ++i) r[i] = to_f32<T>(p[i]);
  return r;
#endif
}

// ---- vector stores with conversion from fp32 (round to nearest even, as from_f32) ----------

// bf16 bit patterns of v, exactly as f32_to_bf16 rounds each lane (NaN stays a quiet NaN).
LLMK_ALWAYS_INLINE vh to_bf16_bits(vf v) {
  const vu u = reinterpret_cast<vu>(v);
  const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const vu quiet = (u >> 16) | 0x40u;
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded, vh);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// to_bf16_bits by the CPU's vcvtneps2bf16, for callers that know the CPU has AVX512-BF16 (one
// instruction for the ~10 of the software rounding). It rounds to nearest even and quiets NaN
// exactly as to_bf16_bits does, but flushes denormal inputs to zero, so a vector holding one takes
// the software path. Inline asm: this build also runs on CPUs without the instruction, so no
// function here may carry its target.
LLMK_ALWAYS_INLINE vh to_bf16_bits_cvt(vf v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(reinterpret_cast<__m512>(v), 0x20) != 0, 0)) return to_bf16_bits(v);
  __m256i r;
  asm("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
  return reinterpret_cast<vh>(r);
}
#endif

// Stores VL elements at p, converted from fp32 (fp32 and bf16: the types a kernel stores so far).
template <DType T>
LLMK_ALWAYS_INLINE void store(typename Elem<T>::type* p, vf v) {
  static_assert(T != DType::F16, "vec::store: no fp16 conversion yet");
  if constexpr (T == DType::F32) storeu(p, v);
  else *reinterpret_cast<vh_u*>(p) = to_bf16_bits(v);
}

// v rounded to bf16 and back to fp32 (by vcvtneps2bf16 when kCvt; the same bits either way).
template <bool kCvt>
LLMK_ALWAYS_INLINE vf round_bf16(vf v) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if constexpr (kCvt) return reinterpret_cast<vf>(__builtin_convertvector(to_bf16_bits_cvt(v), vu) << 16);
#endif
  return reinterpret_cast<vf>(__builtin_convertvector(to_bf16_bits(v), vu) << 16);
}

// store<BF16>, rounded by vcvtneps2bf16 when kCvt (AVX-512 builds; see to_bf16_bits_cvt): the
// same bits either way.
template <bool kCvt>
LLMK_ALWAYS_INLINE void store_bf16(uint16_t* p, vf v) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if constexpr (kCvt) {
    *reinterpret_cast<vh_u*>(p) = to_bf16_bits_cvt(v);
    return;
  }
#endif
  store<DType::BF16>(p, v);
}

// Prefetch the cache lines holding bytes [p, p + bytes) (decode streams K/V rows a tile ahead);
// p need not be line-aligned.
LLMK_ALWAYS_INLINE void prefetch_row(const void* p, int bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), end = a + bytes;
  for (uintptr_t l = a & ~uintptr_t(63); l < end; l += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(l), 0, 1);
}

// ---- transcendental functions ---------------------------------------------------------------

// exp(x) with ~1e-7 relative error; exactly 0 for x <= -88 (incl. -inf).
LLMK_ALWAYS_INLINE vf vexp(vf x) {
  x = vmax(x, splat(-88.f));
  x = vmin(x, splat(88.f));
  const vf t = x * 1.44269504088896341f;
  const vf n = (t + 12582912.f) - 12582912.f;  // round to nearest (|t| < 2^22)
  const vf y = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;  // x - n ln2, 2 parts
  vf p = splat(1.f / 5040);
  p = p * y + 1.f / 720;
  p = p * y + 1.f / 120;
  p = p * y + 1.f / 24;
  p = p * y + 1.f / 6;
  p = p * y + 0.5f;
  p = p * y + 1.f;
  p = p * y + 1.f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;  // n in [-127, 127]
  return p * reinterpret_cast<vf>(e);
}

// tanh through exp; |error| ~ 1e-7 (absolute).
LLMK_ALWAYS_INLINE vf vtanh(vf x) {
  const vf a = vmin(x < 0.f ? -x : x, splat(20.f));
  const vf e = vexp(a + a);
  const vf t = 1.f - 2.f / (e + 1.f);
  return x < 0.f ? -t : t;
}

// Butterfly reductions: after log2(VL) steps every lane holds the result.
LLMK_ALWAYS_INLINE vi xor_mask(int w) {
  vi m;
  for (int o = 0; o < VL; ++o) m[o] = o ^ w;
  return m;
}

LLMK_ALWAYS_INLINE float hsum(vf v) {
  for (int w = VL / 2; w >= 1; w /= 2) v += __builtin_shuffle(v, xor_mask(w));
  return v[0];
}

LLMK_ALWAYS_INLINE float hmax(vf v) {
  for (int w = VL / 2; w >= 1; w /= 2) v = vmax(v, __builtin_shuffle(v, xor_mask(w)));
  return v[0];
}

// Horizontal sums of VL vectors at once: returns r with r[k] = sum of the lanes of v[k]
// (a transposing reduction tree: ~3 ops per vector instead of ~2 log2(VL)).
template <int W>  // current lanes per key
LLMK_ALWAYS_INLINE vf hsum_pair(vf a, vf b) {
  // a and b each hold VL/W keys with W lanes apiece; the result holds 2*VL/W keys with W/2
  // lanes each (a's keys first), every key block summed from its two halves.
  constexpr int H = W / 2;
  vi lo, hi;
  for (int o = 0; o < VL; ++o) {
    const int src = o < VL / 2 ? 0 : VL;       // from a or from b
    const int oo = o % (VL / 2);
    const int k = oo / H, t = oo % H;
    lo[o] = src + k * W + t;
    hi[o] = src + k * W + t + H;
  }
  return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}

LLMK_ALWAYS_INLINE vf hsum_many(vf* v) {
  // Level by level: VL vectors of VL lanes -> ... -> 1 vector of VL keys.
#if !defined(__AVX512F__) && defined(__AVX2__)
  // AVX2: the same additions, with in-lane shuffles where the tree's lane order needs cross-lane
  // ones (GCC emitted two permutes and a blend per shuffle), and one permute at the end.
  __m256 s[4], t[2];
  for (int k = 0; k < 4; ++k) {
    const __m256 a = (__m256)v[2 * k], b = (__m256)v[2 * k + 1];
    s[k] = _mm256_permute2f128_ps(a, b, 0x20) + _mm256_permute2f128_ps(a, b, 0x31);
  }
  for (int k = 0; k < 2; ++k)
    t[k] = _mm256_shuffle_ps(s[2 * k], s[2 * k + 1], 0x44) + _mm256_shuffle_ps(s[2 * k], s[2 * k + 1], 0xEE);
  const __m256 u = _mm256_shuffle_ps(t[0], t[1], 0x88) + _mm256_shuffle_ps(t[0], t[1], 0xDD);
  return (vf)_mm256_permutevar8x32_ps(u, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
#else
  if constexpr (VL >= 16) {
    for (int k = 0; k < 8; ++k) v[k] = hsum_pair<16>(v[2 * k], v[2 * k + 1]);
  }
  if constexpr (VL >= 8) {
    for (int k = 0; k < 4; ++k) v[k] = hsum_pair<8>(v[2 * k], v[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) v[k] = hsum_pair<4>(v[2 * k], v[2 * k + 1]);
  return hsum_pair<2>(v[0], v[1]);
#endif
}

#if defined(__AVX512F__)
// r[i] = row i of 16 x 16 32-bit words -> r[j] = column j (lane transposes, then 64-bit, then
// 128-bit blocks). The attention kernels' Q / V^T packs and the GEMMs' x packs.
LLMK_ALWAYS_INLINE void transpose16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}
#endif

}  // namespace vec
LLMK_NS_END
