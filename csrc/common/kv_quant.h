// Quantised KV-cache storage (vLLM's kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2", and
// "int8"): one byte per element, value = code * scale, with float32 scales per tensor or per kv
// head. Conversions are written out here (no cuda_fp8.h) so that the CPU kernels, the CUDA
// kernels and the SIMT emulator produce the same bits: round to nearest even, saturating to the
// largest finite value (e4m3fn has no inf; e5m2 saturates too, as vLLM's scaled conversions do).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/macros.h"

namespace llmk {

// Storage kind of a KV cache; None = the cache holds the attention dtype itself.
enum class KvQuant : int { None = 0, E4M3 = 1, E5M2 = 2, Int8 = 3 };

}  // namespace llmk

LLMK_NS_BEGIN
namespace kvq {

LLMK_HD uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

LLMK_HD float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// x / scale rounded once in fp32 (IEEE division even under --use_fast_math), so codes match
// torch's (x.float() / scale).to(float8) exactly.
LLMK_HD float div_rn(float x, float scale) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, scale);
#else
  return x / scale;
#endif
}

// Encoder for a float format with M mantissa bits and exponent bias B whose largest finite value
// is max_finite (its bits are max_bits). Round to nearest even, saturating; NaN -> 0x7f | sign.
template <int M, int B>
LLMK_HD uint8_t encode_fp8(float x, float max_finite, uint8_t max_bits) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const float a = fabsf(x);
  if (a != a) return uint8_t(sign | 0x7f);
  if (a >= max_finite) return uint8_t(sign | max_bits);
  const int e = int((u >> 23) & 0xffu) - 127;
  if (e < 1 - B) {  // below the smallest normal: multiples of 2^(1-B-M), exact scaling by 2^k
    const float q = rintf(a * bits_f32(uint32_t(127 + B - 1 + M) << 23));
    return uint8_t(sign | uint8_t(q));  // q == 2^M is the smallest normal's code
  }
  const uint32_t a_bits = u & 0x7fffffffu;
  constexpr int drop = 23 - M;
  const uint32_t r = (a_bits + ((1u << (drop - 1)) - 1u) + ((a_bits >> drop) & 1u)) >> drop;
  return uint8_t(sign | uint8_t(r - (uint32_t(127 - B) << M)));
}

LLMK_HD uint8_t f32_to_e4m3(float x) { return encode_fp8<3, 7>(x, 448.f, 0x7e); }
LLMK_HD uint8_t f32_to_e5m2(float x) { return encode_fp8<2, 15>(x, 57344.f, 0x7b); }

LLMK_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 7u;
  if (exp == 0) return bits_f32(sign | f32_bits(float(man) * 0.001953125f));  // man * 2^-9
  if (exp == 15 && man == 7) return bits_f32(sign | 0x7fc00000u);
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

LLMK_HD float e5m2_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> 2) & 0x1fu, man = b & 3u;
  if (exp == 0) return bits_f32(sign | f32_bits(float(man) * 1.52587890625e-05f));  // man * 2^-16
  if (exp == 31) return bits_f32(sign | (man ? 0x7fc00000u : 0x7f800000u));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 21));
}

// int8: symmetric codes in [-127, 127]; NaN -> 0.
LLMK_HD uint8_t f32_to_i8(float x) {
  if (x != x) return 0;
  const float q = fminf(fmaxf(rintf(x), -127.f), 127.f);
  return uint8_t(int8_t(q));
}

// Code of x (in the attention dtype, as float) for a cache of kind q with scale s.
LLMK_HD uint8_t quantize(float x, float s, KvQuant q) {
  const float y = div_rn(x, s);
  switch (q) {
    case KvQuant::E4M3: return f32_to_e4m3(y);
    case KvQuant::E5M2: return f32_to_e5m2(y);
    default: return f32_to_i8(y);
  }
}

// Value of a code, before the scale.
LLMK_HD float decode(uint8_t c, KvQuant q) {
  switch (q) {
    case KvQuant::E4M3: return e4m3_to_f32(c);
    case KvQuant::E5M2: return e5m2_to_f32(c);
    default: return float(int8_t(c));
  }
}

// Scale of kv head h: scales are [1] (stride 0) or [Hkv] (stride 1).
LLMK_HD float head_scale(const float* scales, int stride, int h) { return scales[stride * h]; }

}  // namespace kvq
LLMK_NS_END
