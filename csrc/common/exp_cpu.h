// Branch-free fp32 exp for the CPU kernels' vectorised loops (libm's expf is a call per element
// that stops the loop from vectorising).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/macros.h"

LLMK_NS_BEGIN

// exp(x) for x <= 0 (and -inf -> 0): Cody-Waite style split x*log2(e) = n + f, 2^f by a degree-6
// Taylor polynomial (|f| <= 1/2, error ~1 ulp), 2^n through the exponent bits. Branch free so that
// the loops vectorise; exp(0) is exactly 1.
LLMK_ALWAYS_INLINE float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float t = xc * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  const float f = (t - n) * 0.693147180559945309f;
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : p * scale;
}

// SiLU(g) = g * sigmoid(g), with the exponential of -|g| only (no overflow, vectorises). The
// numerator is selected before the one division (a select of two quotients vectorises to two
// divisions per vector).
LLMK_ALWAYS_INLINE float silu_fast(float g) {
  const float e = exp_nonpos(g < 0.0f ? g : -g);
  return g * ((g < 0.0f ? e : 1.0f) / (1.0f + e));
}

LLMK_NS_END
