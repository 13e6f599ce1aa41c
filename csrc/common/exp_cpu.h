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
// N values at once, step by step: the polynomial is a chain of dependent FMAs, and interleaving N
// chains lets the core overlap them (one vector at a time, a Zen 2 core mostly waited on the chain).
template <int N, typename V>
LLMK_ALWAYS_INLINE void exp_nonpos_n(const V* x, V* out) {
  const V lo = V{} - 87.0f;
  V n[N], f[N], p[N];
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) {
    const V t = (x[k] < lo ? lo : x[k]) * 1.44269504088896341f;
    n[k] = (t + 12582912.0f) - 12582912.0f;  // round to nearest
    f[k] = (t - n[k]) * 0.693147180559945309f;
    p[k] = V{} + 1.0f / 720.0f;
  }
  constexpr float kCoef[6] = {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma GCC unroll 6
  for (int c = 0; c < 6; ++c) {
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) p[k] = p[k] * f[k] + kCoef[c];
  }
#pragma GCC unroll 8
  for (int k = 0; k < N; ++k) {
    V scale;
    if constexpr (std::is_same_v<V, float>) {
      const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n[k]) + 127) << 23;
      std::memcpy(&scale, &bits, sizeof(scale));
    } else {
      scale = reinterpret_cast<V>((__builtin_convertvector(n[k], vec::vi) + 127) << 23);
    }
    out[k] = x[k] < lo ? V{} : p[k] * scale;
  }
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

LLMK_NS_END
