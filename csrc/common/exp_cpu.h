// Branch-free fp32 exp for the CPU kernels' vectorised loops (libm's expf is a call per element
// that stops the loop from vectorising).
#pragma once
#include <cstdint>
#include <cstring>

#include <type_traits>

#include "common/macros.h"
#include "common/vec_cpu.h"

LLMK_NS_BEGIN

// exp(x) for x <= 0 (and -inf -> 0): Cody-Waite style split x*log2(e) = n + f, 2^f by a degree-6
// Taylor polynomial (|f| <= 1/2, error ~1 ulp), 2^n through the exponent bits. Branch free so that
// the loops vectorise; exp(0) is exactly 1. One template for a float and for a vector of them
// (vec::vf): explicitly vectorised loops get bit-identical results to the scalar ones.
template <typename V>
LLMK_ALWAYS_INLINE V exp_nonpos(V x) {
  const V lo = V{} - 87.0f;
  const V xc = x < lo ? lo : x;
  const V t = xc * 1.44269504088896341f;
  const V n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  const V f = (t - n) * 0.693147180559945309f;
  V p = V{} + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  V scale;
  if constexpr (std::is_same_v<V, float>) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    std::memcpy(&scale, &bits, sizeof(scale));
  } else {
    scale = reinterpret_cast<V>((__builtin_convertvector(n, vec::vi) + 127) << 23);
  }
  return x < lo ? V{} : p * scale;
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

LLMK_NS_END
