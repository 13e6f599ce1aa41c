// Sampling math shared by the CPU kernels and the CUDA kernels: everything that does not depend
// on how threads are mapped to the vocabulary. Counter-based randomness (Philox 4x32-10), the
// order-preserving float keys used to place pivots, the filters' acceptance tests, the pivot
// bracket update of rejection sampling, and the speculative-sampling rules.
//
// Conventions (documented in python/llmkern/ops/sampling.py):
// - A row is a vector of non-negative weights w (probabilities, or exp((x - max) / T) for logits).
//   Entries that are not > 0 (zero, negative, NaN) carry no mass and are never drawn.
// - Every filter keeps an "upper set" {j : w_j >= tau}: a token is kept iff the test below accepts
//   its weight v, computed from count_gt(v) = #{j : w_j > v} and mass_gt(v) = sum{w_j : w_j > v}.
//   Ties at the boundary are therefore all kept (the kept set may exceed k for top-k).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/macros.h"

LLMK_NS_BEGIN

// ---------------------------------------------------------------------------------------------
// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
// ---------------------------------------------------------------------------------------------

struct Philox4 {
  uint32_t v[4];
};

LLMK_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

LLMK_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                              uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, hi0, lo0);
    philox_mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from the top 24 bits: every value is exact in fp32 and 1.0 is impossible.
LLMK_HD float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// The random stream of one output row. Draw number `d` of output row `row` reads the Philox
// block at counter (offset_lo, offset_hi, row, d) under key (seed_lo, seed_hi): no state, so any
// thread can produce any draw, and results do not depend on how rows are scheduled.
struct RowRng {
  uint32_t k0, k1, c0, c1, row;

  LLMK_HD static RowRng make(uint64_t seed, uint64_t offset, uint32_t row) {
    return RowRng{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                  static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), row};
  }
  LLMK_HD float uniform(uint32_t draw) const {
    return uint_to_unit_float(philox4x32_10(c0, c1, row, draw, k0, k1).v[0]);
  }
};

// ---------------------------------------------------------------------------------------------
// Order-preserving keys: float order == uint32 order of the keys (NaN excluded). Pivots placed
// at the key midpoint halve the number of representable floats in a bracket, which bounds the
// number of rounds of any pivot search by 32 whatever the distribution.
// ---------------------------------------------------------------------------------------------

LLMK_HD uint32_t float_bits(float f) {
  union { float f; uint32_t u; } c;
  c.f = f;
  return c.u;
}
LLMK_HD float bits_float(uint32_t u) {
  union { float f; uint32_t u; } c;
  c.u = u;
  return c.f;
}
LLMK_HD uint32_t order_key(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
LLMK_HD float key_to_float(uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// A float strictly between a and b when one exists (a < b), else a.
LLMK_HD float key_midpoint(float a, float b) {
  const uint32_t ka = order_key(a), kb = order_key(b);
  return key_to_float(ka + (kb - ka) / 2u);
}
// The largest float below f (f > -inf): {w : w > below(f)} == {w : w >= f}.
LLMK_HD float float_below(float f) {
  return key_to_float(order_key(f) - 1u);
}

// ---------------------------------------------------------------------------------------------
// Filters.
// ---------------------------------------------------------------------------------------------

// Per-row filter parameters after defaults are resolved. k == 0 / top_p >= 1 / min_p == 0 switch
// a filter off.
struct RowFilter {
  int64_t k;      // top-k: keep tokens with fewer than k tokens strictly above them
  float top_p;    // top-p: keep tokens whose strictly-greater mass is below top_p * ref_mass
  float min_p;    // min-p: keep tokens with w >= min_p * max(w)
  bool k_first;   // top_k_first: top-p applies to the top-k set renormalised (ref_mass = its mass)

  LLMK_HD bool has_k(int64_t n) const { return k > 0 && k < n; }
  LLMK_HD bool has_p() const { return top_p < 1.0f; }
  LLMK_HD bool has_min_p() const { return min_p > 0.0f; }
};

// The kept-set test for a token of weight v (rejection sampling's acceptance test and the exact
// threshold searches use the same rule). ref_mass: total row mass (joint) or top-k set mass
// (top_k_first). Mass is accumulated in double by every backend, so the test only differs
// between backends when mass_gt(v) is within rounding of top_p * ref_mass.
LLMK_HD bool topk_accepts(int64_t k, int64_t count_gt) { return k <= 0 || count_gt < k; }
// The most likely tokens (nothing strictly above them) are always kept: top_p 0 keeps just those.
LLMK_HD bool topp_accepts(float top_p, double mass_gt, double ref_mass) {
  return top_p >= 1.0f || mass_gt < static_cast<double>(top_p) * ref_mass || !(mass_gt > 0.0);
}
// min-p is a known threshold: no search needed, it sets the initial lower pivot.
LLMK_HD float min_p_threshold(float min_p, float max_w) { return min_p * max_w; }

// Rejection sampling keeps a bracket (low, high]: every token with w <= low is rejected
// (candidates are drawn from {w > low}) and high is a weight the filter accepts. Each round draws a
// candidate c from {w > low} with probability proportional to w and tests pivots between w_c and
// high in one pass over the row: if w_c is accepted, c is the sample (conditioned on the kept set,
// it is distributed proportionally to w, since the kept set is inside {w > low}); otherwise low
// rises to the largest rejected pivot and high falls to the smallest accepted one. Every rejection
// removes the candidate's weight class and halves the key range (low, high] (in key space), so a
// row needs at most ~33 rounds; typical rows need 1-4. The exact threshold searches use the same
// bracket with the smallest element above low as a pivot. (row_algo.h implements both.)
//
// Second pivot of a round: the geometric mean of the candidate's weight and the known-accepted
// weight. It halves the bracket's log-range (so, like a key midpoint, it bounds the rounds: floats
// are spaced about evenly in log), and it is scale-free: rows that differ by a constant factor
// (logits' exp weights and their softmax, say) get the same pivots up to rounding, hence the same
// decisions and draws. Computed in double (no underflow, correctly rounded on every backend).
LLMK_HD float round_pivot(float v0, float high) {
  if (!(v0 < high) || !(v0 > 0.0f)) return v0;
  const float g = static_cast<float>(sqrt(static_cast<double>(v0) * static_cast<double>(high)));
  return (g > v0 && g < high) ? g : v0;
}

// ---------------------------------------------------------------------------------------------
// Renormalisation and masking rules.
// ---------------------------------------------------------------------------------------------

// A renormalised filter keeps {w > lo} (lo >= 0: the largest rejected pivot) and rescales it to
// sum to one; everything else (and every non-positive or NaN entry) becomes 0. inv_mass 0 (a row
// without positive finite mass) makes the whole row 0, +inf entries included.
LLMK_HD float renorm_value(float w, float lo, double inv_mass) {
  return (w > lo && inv_mass > 0.0) ? static_cast<float>(w * inv_mass) : 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Chain speculative sampling (Leviathan et al. 2023; Chen et al. 2023).
// ---------------------------------------------------------------------------------------------

// Draft token accepted with probability min(1, p/q): u * q < p with u uniform in [0, 1).
LLMK_HD bool spec_accepts(float u, float q, float p) { return u * q < p; }
// Distribution sampled at the first rejection: normalised relu(p - q).
LLMK_HD float spec_residual(float p, float q) {
  const float r = p - q;
  return r > 0.0f ? r : 0.0f;
}
// Draw numbers of a speculative row: acceptance of draft position i uses draw i; the final token
// (residual at the first rejection, or the bonus token) uses draw n + 1 (n = draft length).
LLMK_HD uint32_t spec_final_draw(int64_t n) { return static_cast<uint32_t>(n + 1); }

// ---------------------------------------------------------------------------------------------
// Token bitmasks (xgrammar's layout): token j is allowed when bit j % 32 of word j / 32 is set.
// A disallowed token is treated as a -inf logit / zero probability.
// ---------------------------------------------------------------------------------------------

LLMK_HD bool token_allowed(const int32_t* mask, int64_t j) {
  return ((static_cast<uint32_t>(mask[j >> 5]) >> (j & 31)) & 1u) != 0;
}

// ---------------------------------------------------------------------------------------------
// Penalties (vLLM semantics).
// ---------------------------------------------------------------------------------------------

// Repetition divides positive logits and multiplies the others, for tokens seen in the prompt or
// the output; frequency subtracts freq * count, presence subtracts pres once if count > 0.
LLMK_HD float apply_penalty(float x, bool seen, int64_t out_count, float rep, float freq, float pres) {
  if (seen) x = x > 0.0f ? x / rep : x * rep;
  return x - freq * static_cast<float>(out_count) - (out_count > 0 ? pres : 0.0f);
}

LLMK_NS_END
