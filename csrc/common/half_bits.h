// fp16 / bf16 <-> fp32 conversions on bit patterns, portable C++ (no intrinsics): the one
// implementation behind the CPU kernels' element access (vec_cpu.h, which uses F16C instructions
// where the build has them: same results) and the SIMT emulator's __half / __nv_bfloat16
// (simt/simt_half.h). fp32 -> fp16 / bf16 rounds to nearest even (subnormals, overflow to inf); the
// other direction is exact. NaN becomes the quiet NaN with the input's sign (CUDA returns its own
// canonical NaN: simt/simt_half.h substitutes it).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/macros.h"

LLMK_NS_BEGIN

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_bits_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_to_f32(sign | 0x7f800000u | (m << 13));  // inf / NaN
  if (e != 0) return bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
  return bits_to_f32(sign | f32_to_bits(static_cast<float>(m) * 5.9604644775390625e-8f));  // m * 2^-24
}

inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a >= 0x38800000u) {                                             // normal half
    uint32_t r = a - 0x38000000u;                                     // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                                   // round to nearest even
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal half (or zero): units of 2^-24. Adding 2^23 makes the float unit 1, so the FPU's
  // round-to-nearest-even does the rounding (a carry into the smallest normal is correct).
  const float t = bits_to_f32(a) * 16777216.0f + 8388608.0f;
  return static_cast<uint16_t>(sign | (f32_to_bits(t) - 0x4b000000u));
}

LLMK_NS_END
