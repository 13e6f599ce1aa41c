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
LLMK_HD bool topp_accepts(float top_p, double mass_gt, double ref_mass) {
  return top_p >= 1.0f || mass_gt < static_cast<double>(top_p) * ref_mass;
}
LLMK_HD bool filter_accepts(const RowFilter& f, int64_t count_gt, double mass_gt, double ref_mass) {
  return topk_accepts(f.k, count_gt) && topp_accepts(f.top_p, mass_gt, ref_mass);
}
// min-p is a known threshold: no search needed, it sets the initial lower pivot.
LLMK_HD float min_p_threshold(float min_p, float max_w) { return min_p * max_w; }

// Bracket of rejection sampling / threshold search. Invariants:
//   every token with w <= low is rejected (candidates are drawn from {w > low});
//   high is a weight that the filter accepts (the kept set contains every w >= high).
// Each round draws a candidate c from {w > low} with probability proportional to w and tests two
// pivots in one pass over the row: v0 = w_c and v1 = key_midpoint(v0, high). Then
//   v0 accepted            -> c is the sample (conditioned on the kept set, it is distributed
//                              proportionally to w, since the kept set is inside {w > low});
//   v0 rejected, v1 accepted -> low = v0, high = v1;
//   both rejected          -> low = v1.
// Every rejection removes the candidate's weight class and halves the key range (low, high]
// (in key space), so a row needs at most ~33 rounds; typical rows need 1-4.
struct PivotBracket {
  float low;        // exclusive lower bound of the candidate set
  float high;       // a weight known to be accepted
  double mass_low;  // mass_gt(low): the mass the next candidate is drawn from
  int64_t count_low;

  // Outcome of testing pivots (v0 accepted?, v1 accepted?) with their statistics.
  // Returns true when the candidate is accepted.
  LLMK_HD bool update(float v0, bool acc0, double mass0, int64_t cnt0, float v1, bool acc1,
                      double mass1, int64_t cnt1) {
    if (acc0) return true;
    if (acc1) {
      low = v0;
      mass_low = mass0;
      count_low = cnt0;
      if (v1 < high) high = v1;
    } else {
      low = v1;
      mass_low = mass1;
      count_low = cnt1;
    }
    return false;
  }
};

// Second pivot of a round: between the candidate's weight and the known-accepted weight.
LLMK_HD float round_pivot(float v0, float high) { return v0 < high ? key_midpoint(v0, high) : v0; }

// Exact threshold search (renormalisation, masking, top_k_first's top-k set): the kept set is
// {w >= tau}. State: lo is rejected (or the domain's lower end), next_lo = min{w : w > lo} is the
// smallest element above lo, hi is accepted. Each pass tests next_lo and key_midpoint(next_lo, hi);
// the search ends when next_lo is accepted (then tau = next_lo and the kept set is {w > lo}).
struct ThresholdSearch {
  float lo, next_lo, hi;
  double mass_lo;
  int64_t count_lo;
  bool done;

  LLMK_HD float pivot0() const { return next_lo; }
  LLMK_HD float pivot1() const { return next_lo < hi ? key_midpoint(next_lo, hi) : next_lo; }
  // acc/mass/count/min_gt: statistics of pivot0 and pivot1 from one pass.
  LLMK_HD void update(bool acc0, double mass0, int64_t cnt0, float min0, bool acc1, double mass1,
                      int64_t cnt1, float min1) {
    const float p0 = pivot0(), p1 = pivot1();
    if (acc0) {
      done = true;  // the smallest element above lo is kept: tau = next_lo
      return;
    }
    if (acc1) {
      lo = p0;
      next_lo = min0;
      mass_lo = mass0;
      count_lo = cnt0;
      if (p1 < hi) hi = p1;
    } else {
      lo = p1;
      next_lo = min1;
      mass_lo = mass1;
      count_lo = cnt1;
    }
    // next_lo >= hi: every element above lo is accepted.
    if (!(next_lo < hi)) done = true;
  }
};

// ---------------------------------------------------------------------------------------------
// Renormalisation and masking rules.
// ---------------------------------------------------------------------------------------------

// A renormalised filter keeps {w > lo} (lo >= 0: the largest rejected pivot) and rescales it to
// sum to one; everything else (and every non-positive or NaN entry) becomes 0.
LLMK_HD float renorm_value(float w, float lo, double inv_mass) {
  return w > lo ? static_cast<float>(w * inv_mass) : 0.0f;
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
// Penalties (vLLM semantics).
// ---------------------------------------------------------------------------------------------

// Repetition divides positive logits and multiplies the others, for tokens seen in the prompt or
// the output; frequency subtracts freq * count, presence subtracts pres once if count > 0.
LLMK_HD float apply_penalty(float x, bool seen, int64_t out_count, float rep, float freq, float pres) {
  if (seen) x = x > 0.0f ? x / rep : x * rep;
  return x - freq * static_cast<float>(out_count) - (out_count > 0 ? pres : 0.0f);
}

LLMK_NS_END
