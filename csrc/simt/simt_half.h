// fp16 / bf16 storage types for the SIMT emulation, with the names and conversion semantics of
// cuda_fp16.h / cuda_bf16.h: float -> half/bf16 rounds to nearest even (subnormals, overflow to
// inf and NaN included), half/bf16 -> float is exact. Arithmetic goes through float, which is
// exact for one fp16/bf16 operation (fp32 has more than 2p+2 bits, so no double rounding).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/half_bits.h"

namespace llmk {
namespace simt {

// The shared bit conversions (half_bits.h), with CUDA's canonical NaN.
inline uint16_t f32_to_f16_bits(float f) { return f != f ? 0x7fffu : ::llmk::f32_to_f16_bits(f); }
inline float f16_bits_to_f32(uint16_t h) { return ::llmk::f16_bits_to_f32(h); }
inline uint16_t f32_to_bf16_bits(float f) { return f != f ? 0x7fffu : ::llmk::f32_to_bf16_bits(f); }
inline float bf16_bits_to_f32(uint16_t b) { return ::llmk::bf16_bits_to_f32(b); }

}  // namespace simt
}  // namespace llmk

struct __align__(2) __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(::llmk::simt::f32_to_f16_bits(f)) {}
  operator float() const { return ::llmk::simt::f16_bits_to_f32(__x); }
};

struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(::llmk::simt::f32_to_bf16_bits(f)) {}
  operator float() const { return ::llmk::simt::bf16_bits_to_f32(__x); }
};

struct __align__(4) __half2 {
  __half x, y;
};
struct __align__(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }

inline __half2 __floats2half2_rn(float lo, float hi) { return {__half(lo), __half(hi)}; }
inline __half2 __float22half2_rn(float2 v) { return {__half(v.x), __half(v.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__nv_bfloat16(lo), __nv_bfloat16(hi)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) {
  return {__nv_bfloat16(v.x), __nv_bfloat16(v.y)};
}
inline float __low2float(__half2 v) { return static_cast<float>(v.x); }
inline float __high2float(__half2 v) { return static_cast<float>(v.y); }
inline float __low2float(__nv_bfloat162 v) { return static_cast<float>(v.x); }
inline float __high2float(__nv_bfloat162 v) { return static_cast<float>(v.y); }
inline float2 __half22float2(__half2 v) { return {static_cast<float>(v.x), static_cast<float>(v.y)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) {
  return {static_cast<float>(v.x), static_cast<float>(v.y)};
}

inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) {
  __half h;
  h.__x = u;
  return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}

// Arithmetic and comparisons (cuda_fp16.hpp / cuda_bf16.hpp operators): computed in float,
// rounded once.
#define LLMK_SIMT_HALF_OPS(T)                                                               \
  inline T operator+(T a, T b) { return T(static_cast<float>(a) + static_cast<float>(b)); } \
  inline T operator-(T a, T b) { return T(static_cast<float>(a) - static_cast<float>(b)); } \
  inline T operator*(T a, T b) { return T(static_cast<float>(a) * static_cast<float>(b)); } \
  inline T operator/(T a, T b) { return T(static_cast<float>(a) / static_cast<float>(b)); } \
  inline T operator-(T a) {                                                                  \
    T r = a;                                                                                 \
    r.__x ^= 0x8000u;                                                                        \
    return r;                                                                                \
  }                                                                                          \
  inline T& operator+=(T& a, T b) { return a = a + b; }                                     \
  inline T& operator-=(T& a, T b) { return a = a - b; }                                     \
  inline T& operator*=(T& a, T b) { return a = a * b; }                                     \
  inline T& operator/=(T& a, T b) { return a = a / b; }                                     \
  inline bool operator==(T a, T b) { return static_cast<float>(a) == static_cast<float>(b); } \
  inline bool operator!=(T a, T b) { return static_cast<float>(a) != static_cast<float>(b); } \
  inline bool operator<(T a, T b) { return static_cast<float>(a) < static_cast<float>(b); }   \
  inline bool operator<=(T a, T b) { return static_cast<float>(a) <= static_cast<float>(b); } \
  inline bool operator>(T a, T b) { return static_cast<float>(a) > static_cast<float>(b); }   \
  inline bool operator>=(T a, T b) { return static_cast<float>(a) >= static_cast<float>(b); }
LLMK_SIMT_HALF_OPS(__half)
LLMK_SIMT_HALF_OPS(__nv_bfloat16)
#undef LLMK_SIMT_HALF_OPS

inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
