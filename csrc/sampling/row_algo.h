// The per-row algorithms of the sampling kernels, written once for both backends: rejection
// sampling with pivots (sample_loaded), the exact threshold search (exact_search), the kept set of
// the renormalising / masking ops (renorm_plan) and chain speculative sampling (spec_row). The
// rules they apply (filters, bracket updates, Philox draws) are in sampling_math.h.
//
// A backend supplies a "row" R: one row of weights (probabilities, or softmax weights of logits)
// and the passes over it. CPU: rowcpu::Row (row_engine_cpu.h), one thread or a team per row;
// CUDA: samp::DeviceRow (sampling_row.cuh), one CTA per row. Every method returns results that are
// identical on all the threads calling it, so control flow stays uniform.
//
//   template <int P, bool WantMin> void stats(const float* piv, PivotStats* out);
//       mass, count (and smallest element) strictly above each of P ascending pivots
//   void set_low(int p);        pivot p of the last stats() bounds the next selections from below
//   Pick select(float low, double target);
//       inverse CDF over {w > low}: the first token (vocabulary order) whose running mass exceeds
//       target (the last one above low when rounding keeps the sum from crossing)
//   void narrowed(float low, int64_t cnt_low, double& mass_low);
//       the lower bound rose (may shrink the working set and refresh mass_low)
//   float bracket_draw(const Search& s, float u);   a weight drawn by mass from (lo, hi], or NaN
//   void search_narrowed(Search& s, bool compact);  a search's bracket narrowed
//   template <class Acc> void search_fallback(Search& s, const Acc& acc);  pass cap reached
//   Threshold topk_set(int64_t k, const Search& dom, const RowRng* rng, uint32_t draw_base,
//                      bool compact, bool want_mass);
//       the exact top-k set {w > low} among the weights above dom.lo (its mass if want_mass); the
//       rng, draw base and compaction are hints a pivot search may use
#pragma once
#include <cmath>
#include <cstdint>

#include "sampling/sampling.h"
#include "sampling/sampling_math.h"

#if defined(__CUDACC__)
#define LLMK_ROW __device__
#else
#define LLMK_ROW inline
#endif

LLMK_NS_BEGIN

// Statistics of one pivot over a row.
struct PivotStats {
  double mass = 0.0;      // sum of w > v
  int64_t cnt = 0;        // #{w > v}
  float min_gt = INFINITY;  // min{w > v}
};

// A selected token and its weight (token < 0: nothing above the bound).
struct Pick {
  int64_t token;
  float w;
};

// A row after its load pass: statistics of {w > 0} and the maximum.
struct Loaded {
  double mass = 0.0;       // sum of positive weights
  int64_t cnt = 0;         // number of positive weights
  float min_pos = INFINITY;  // smallest positive weight
  float max_w = 0.0f;
  int64_t argmax = 0;      // vocabulary id of the first maximum (NaN ignored)
  bool degenerate = false;  // no positive finite mass
  bool done = false;       // greedy: argmax is the answer
};

// A kept set {w > low} with its mass and size.
struct Threshold {
  float low;
  double mass;
  int64_t cnt;
};

struct RowResult {
  int64_t token;
  bool valid;
};

// State of an exact threshold search: lo is rejected, next_lo = min{w > lo}, hi is accepted.
// off_*: mass and count above hi that a backend dropped from its working set (bracket compaction).
struct Search {
  float lo, next_lo, hi;
  double mass_lo, mass_hi, off_mass;
  int64_t cnt_lo, cnt_hi, off_cnt;

  LLMK_HD static Search over(float lo, float next_lo, float hi, double mass_lo, int64_t cnt_lo) {
    return Search{lo, next_lo, hi, mass_lo, 0.0, 0.0, cnt_lo, 0, 0};
  }
};

// Acceptance tests of the kept sets (sampling_math.h's rules) on a pivot's statistics.
struct TopKAcc {
  int64_t k;
  LLMK_HD bool operator()(const PivotStats& s) const { return topk_accepts(k, s.cnt); }
};
struct TopPAcc {
  float p;
  double ref;
  LLMK_HD bool operator()(const PivotStats& s) const { return topp_accepts(p, s.mass, ref); }
};
struct JointAcc {
  int64_t k;
  float p;
  double ref;
  LLMK_HD bool operator()(const PivotStats& s) const {
    return topk_accepts(k, s.cnt) && topp_accepts(p, s.mass, ref);
  }
};

// Passes of an exact search / rounds of rejection sampling before the exact fallback. Every pass
// halves the key range of the bracket (see sampling_math.h), so ~33 suffice for any row.
constexpr int kPassCap = 64;

template <int P>
LLMK_HD void sort_pivots(float* p) {
  for (int i = 1; i < P; ++i)
    for (int j = i; j > 0 && p[j] < p[j - 1]; --j) {
      const float t = p[j];
      p[j] = p[j - 1];
      p[j - 1] = t;
    }
}

// Index of the first accepted pivot (ascending pivots), P if none.
template <int P, class Acc>
LLMK_HD int first_accepted(const PivotStats* st, const Acc& accepts) {
  for (int p = 0; p < P; ++p)
    if (accepts(st[p])) return p;
  return P;
}

// a + (b - a) * f when that lies in [a, b], else a.
LLMK_HD float bracket_point(float a, float b, float f) {
  const float q = a + (b - a) * f;
  return (q - q == 0.0f && q >= a && q <= b) ? q : a;
}

// Temperature 0, or one so small that 1 / T overflows: the limit T -> 0, the one-hot at the argmax.
LLMK_HD bool greedy_temperature(float temperature) {
  return !(temperature > 0.0f) || !(1.0f / temperature < INFINITY);
}

// The logits' load decisions from the row maximum: nothing finite to sample from or a +inf logit
// (degenerate), a greedy temperature. Returns true when the row needs no weights.
LLMK_HD bool logits_row_decided(float max_logit, float temperature, Loaded& L) {
  if (!(max_logit > -INFINITY) || max_logit == INFINITY) {
    L.degenerate = true;
    return true;
  }
  if (greedy_temperature(temperature)) {
    L.done = true;
    return true;
  }
  return false;
}
LLMK_HD bool degenerate_mass(double m) { return !(m > 0.0) || m == static_cast<double>(INFINITY); }

// Finds the kept set {w > lo} of a monotone filter exactly. Pivots of a pass: next_lo (the
// smallest element above lo), a candidate drawn by mass from the bracket when `rng` is set (else
// the bracket's quarter point), and the arithmetic and key midpoints of [next_lo, hi]. The key
// midpoint halves the bracket every pass whatever the other pivots are, which bounds the passes.
template <class R, class Acc>
LLMK_ROW void exact_search(R& r, Search& S, const Acc& accepts, const RowRng* rng, uint32_t draw_base,
                           bool compact) {
  for (int pass = 0;; ++pass) {
    if (!(S.next_lo < S.hi)) return;  // every element above lo is accepted
    if (pass == kPassCap) return r.search_fallback(S, accepts);
    const float a = S.next_lo;
    float c = bracket_point(a, S.hi, 0.25f);
    if (rng) {
      const float d = r.bracket_draw(S, rng->uniform(draw_base + static_cast<uint32_t>(pass)));
      if (d > a && d < S.hi) c = d;
    }
    float piv[4] = {a, c, bracket_point(a, S.hi, 0.5f), key_midpoint(a, S.hi)};
    sort_pivots<4>(piv);
    PivotStats st[4];
    r.template stats<4, true>(piv, st);
    for (int p = 0; p < 4; ++p) {
      st[p].mass += S.off_mass;
      st[p].cnt += S.off_cnt;
    }
    const int fa = first_accepted<4>(st, accepts);
    if (fa == 0) return;  // the smallest element above lo is kept
    const int j = fa - 1;
    S.lo = piv[j];
    S.next_lo = st[j].min_gt;
    S.mass_lo = st[j].mass;
    S.cnt_lo = st[j].cnt;
    r.set_low(j);
    if (fa < 4 && piv[fa] < S.hi) {
      S.hi = piv[fa];
      S.mass_hi = st[fa].mass;
      S.cnt_hi = st[fa].cnt;
    }
    if (!(S.next_lo < S.hi)) return;
    r.search_narrowed(S, compact);
  }
}

// Draws one token from a loaded row under filter f. Rejection sampling with pivots: draw a
// candidate from {w > low}; test it and two more pivots between it and the known-accepted `high`
// in one pass; accept, or raise low to the largest rejected pivot and repeat (sampling_math.h).
template <class R>
LLMK_ROW RowResult sample_loaded(R& r, const Loaded& L, const RowFilter& f, const RowRng& rng) {
  if (L.done) return {L.argmax, true};
  if (L.degenerate) return {L.argmax, false};
  uint32_t draw = 0;
  float low = 0.0f, high = L.max_w;
  double mass_low = L.mass, ref = L.mass;
  int64_t cnt_low = L.cnt;
  bool need_k = f.has_k(L.cnt);
  const bool need_p = f.has_p();
  if (f.has_min_p()) {
    const float tau = min_p_threshold(f.min_p, L.max_w);
    if (tau > 0.0f) {
      low = float_below(tau);
      PivotStats st[1];
      r.template stats<1, false>(&low, st);
      r.set_low(0);
      mass_low = st[0].mass;
      cnt_low = st[0].cnt;
    }
  }
  if (need_k && (f.k_first || !need_p)) {
    // The top-k set is found exactly first (top_k_first: the top-p mass is relative to it), then
    // the draw is made inside it.
    const Threshold t = r.topk_set(f.k, Search::over(0.0f, L.min_pos, L.max_w, L.mass, L.cnt), &rng,
                                   0x80000000u, /*compact=*/false, /*want_mass=*/true);
    low = t.low;
    mass_low = t.mass;
    cnt_low = t.cnt;
    ref = t.mass;
    need_k = false;
    r.narrowed(low, cnt_low, mass_low);
  }
  if (!need_k && !need_p) {
    const Pick pk = r.select(low, static_cast<double>(rng.uniform(draw)) * mass_low);
    return pk.token < 0 ? RowResult{L.argmax, false} : RowResult{pk.token, true};
  }
  const JointAcc accepts{need_k ? f.k : 0, need_p ? f.top_p : 1.0f, ref};
  for (int round = 0; round < kPassCap; ++round) {
    const Pick pk = r.select(low, static_cast<double>(rng.uniform(draw++)) * mass_low);
    if (pk.token < 0) return {L.argmax, false};
    const float v0 = pk.w;
    if (!(v0 < high)) return {pk.token, true};  // at or above a known-accepted weight
    // candidate, key midpoint (bounds the rounds), arithmetic midpoint (fast for peaked rows)
    float piv[3] = {v0, round_pivot(v0, high), v0 + (high - v0) * 0.5f};
    sort_pivots<3>(piv);
    PivotStats st[3];
    r.template stats<3, false>(piv, st);
    const int fa = first_accepted<3>(st, accepts);
    if (fa == 0) return {pk.token, true};
    low = piv[fa - 1];
    mass_low = st[fa - 1].mass;
    cnt_low = st[fa - 1].cnt;
    r.set_low(fa - 1);
    if (fa < 3 && piv[fa] < high) high = piv[fa];
    r.narrowed(low, cnt_low, mass_low);
  }
  // Not reached: every rejection halves the key range of (low, high]. Were the cap hit, the kept
  // set is found exactly and the draw made from it, never from a rejected candidate.
  PivotStats s0[1];
  r.template stats<1, true>(&low, s0);
  r.set_low(0);
  Search S = Search::over(low, s0[0].min_gt, high, s0[0].mass, s0[0].cnt);
  exact_search(r, S, accepts, static_cast<const RowRng*>(nullptr), 0u, false);
  const Pick pk = r.select(S.lo, static_cast<double>(rng.uniform(draw)) * S.mass_lo);
  return pk.token < 0 ? RowResult{L.argmax, false} : RowResult{pk.token, true};
}

// The kept set of a renormalising op on a loaded row (weights = probabilities): {w > lo},
// rescaled by inv (0 for a degenerate row: everything becomes 0).
struct RenormPlan {
  float lo;
  double inv;
};

template <class R>
LLMK_ROW RenormPlan renorm_plan(R& r, const Loaded& L, RenormKind kind, int64_t k, float p, uint32_t row) {
  if (L.degenerate) return {0.0f, 0.0};
  const RowRng rng = RowRng::make(0x9e3779b97f4a7c15ull, 0, row);  // pivot draws only
  Search S = Search::over(0.0f, L.min_pos, L.max_w, L.mass, L.cnt);
  if (kind == RenormKind::TopK) {
    if (k > 0 && k < L.cnt) {
      const Threshold t = r.topk_set(k, S, &rng, 0u, /*compact=*/true, /*want_mass=*/true);
      S.lo = t.low;
      S.mass_lo = t.mass;
    }
  } else if (p < 1.0f) {
    exact_search(r, S, TopPAcc{p, L.mass}, &rng, 0u, /*compact=*/true);
  }
  return {S.lo, S.mass_lo > 0.0 ? 1.0 / S.mass_lo : 0.0};
}

// top_k_mask_logits: the logits above which fewer than k finite logits lie (dom = stats of the
// logits above -inf: count, smallest, largest). -inf keeps everything.
template <class R>
LLMK_ROW float mask_threshold(R& r, int64_t k, int64_t cnt, float min_x, float max_x) {
  if (!(k > 0 && k < cnt)) return -INFINITY;
  return r.topk_set(k, Search::over(-INFINITY, min_x, max_x, 0.0, cnt), static_cast<const RowRng*>(nullptr),
                    0u, /*compact=*/true, /*want_mass=*/false)
      .low;
}

// ---- chain speculative sampling ------------------------------------------------------------------

// Which weights the final draw of a speculative row reads: the target row p, the residual
// relu(p - q), or p with a one-hot draft at the proposed token.
enum class ResidualMode : int { Plain = 0, Dense = 1, OneHot = 2 };

// A speculative row's view of its inputs (backend): id(i) the draft token at position i,
// p(i, t) / q(i, t) the target / draft probability of token t at position i (q = 1 for one-hot
// drafts), and residual passes over position m: mass(mode) loads the weights of that mode and
// returns their positive mass, select(mode, target) draws from them (vocabulary id, -1: none).
// Draws from the residual at position m (falls back to p when the residual has no mass;
// sr.empty_token() when neither has).
template <class SR>
LLMK_ROW int64_t draw_residual(SR& sr, int64_t m, ResidualMode mode, float u) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const ResidualMode md = attempt == 1 ? ResidualMode::Plain : mode;
    const double total = sr.residual_mass(m, md);
    if (total > 0.0 && total != static_cast<double>(INFINITY)) {
      const int64_t pos = sr.residual_select(m, md, static_cast<double>(u) * total);
      if (pos >= 0) return pos;
    }
    if (md == ResidualMode::Plain) break;
  }
  return sr.empty_token();
}

struct SpecResult {
  int64_t emitted;   // draft tokens emitted (the first rejection's position, or n)
  int64_t accepted;  // positions whose test passes independently of earlier rejections
  int64_t last;      // the resampled / bonus token
};

template <class SR>
LLMK_ROW SpecResult spec_row(SR& sr, int64_t n, bool has_draft_probs, const RowRng& rng) {
  int64_t indep = 0, first_reject = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = sr.id(i);
    const bool ok = spec_accepts(rng.uniform(static_cast<uint32_t>(i)), sr.q(i, d), sr.p(i, d));
    indep += ok ? 1 : 0;
    if (!ok && first_reject < 0) first_reject = i;
  }
  const int64_t m = first_reject < 0 ? n : first_reject;
  const float u = rng.uniform(spec_final_draw(n));
  const ResidualMode mode = first_reject < 0 ? ResidualMode::Plain
                            : has_draft_probs ? ResidualMode::Dense
                                              : ResidualMode::OneHot;
  return {m, indep, draw_residual(sr, m, mode, u)};
}

// Output row of a request: the emitted drafts, the final token, then -1.
template <class SR>
LLMK_ROW void spec_write(SR& sr, int32_t* o, int64_t n, const SpecResult& res) {
  for (int64_t i = 0; i < res.emitted; ++i) o[i] = static_cast<int32_t>(sr.id(i));
  o[res.emitted] = static_cast<int32_t>(res.last);
  for (int64_t i = res.emitted + 1; i <= n; ++i) o[i] = -1;
}

LLMK_NS_END
