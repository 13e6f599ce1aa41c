// CPU kernels of the sampling ops: sorting-free rejection sampling with pivots (sample_rows) and
// exact pivot searches for renormalisation / masking (renorm_rows). See sampling_math.h for the
// rules and row_engine_cpu.h for the passes.
#include <algorithm>
#include <cmath>

#include "sampling/row_engine_cpu.h"
#include "sampling/small_k_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

// A row after its load pass: statistics of {w > 0} and the maximum.
struct Loaded {
  double mass = 0.0;     // sum of positive weights
  int64_t cnt = 0;       // number of positive weights
  float min_pos = kInf;  // smallest positive weight
  float max_w = 0.0f;
  int64_t argmax = 0;    // vocabulary id of the first maximum (NaN ignored)
  bool degenerate = false;
  bool done = false;     // greedy: argmax is the answer
};

// Combines the load pass's per-block partials (stats of pivot 0 and max/argmax) in block order.
void combine_load(Row& r, Loaded& L) {
  Shared& s = r.shared();
  const int64_t nb = r.span.nblocks();
  auto& lm = r.low_mass_blocks();
  auto& lc = r.low_cnt_blocks();
  lm.resize(nb);
  lc.resize(nb);
  float best = -kInf;
  int64_t arg = 0;
  for (int64_t b = 0; b < nb; ++b) {
    L.mass += static_cast<double>(s.bmass[b]);
    L.cnt += s.bcnt[b];
    L.min_pos = std::min(L.min_pos, s.bmin[b]);
    lm[b] = s.bmass[b];
    lc[b] = s.bcnt[b];
    if (s.bmax[b] > best) {
      best = s.bmax[b];
      arg = s.barg[b];
    }
  }
  L.max_w = best;
  L.argmax = arg;
  L.degenerate = !(L.mass > 0.0) || !std::isfinite(L.mass);
}

// fp32 rows are read in place; fp16/bf16 rows are converted into the shared scratch row.
template <typename T>
const float* row_weights(const T* x, Shared& s) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return s.w.data();
  }
}

// Probabilities: fp32 rows are used in place, fp16/bf16 rows are converted into the scratch row.
template <typename T>
Loaded load_probs(Row& r, const T* x, int64_t V) {
  Shared& s = r.shared();
  const float* w = row_weights(x, s);
  r.span = Span{w, nullptr, V};
  const int64_t nb = r.span.nblocks();
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    if constexpr (!std::is_same_v<T, float>) block_convert(x, lo, hi, s.w.data());
    store_positive_stats(s, w, lo, hi, b);
    block_max_arg(w, lo, hi, s.bmax[b], s.barg[b]);
  });
  Loaded L;
  combine_load(r, L);
  return L;
}

// Logits: pass 1 finds the maximum, pass 2 writes w = exp((x - max) / T) into the scratch row.
template <typename T>
Loaded load_logits(Row& r, const T* x, int64_t V, float temperature) {
  Shared& s = r.shared();
  const int64_t nb = (V + kBlock - 1) / kBlock;
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    block_max_arg(x, lo, hi, s.bmax[b], s.barg[b]);
  });
  Loaded L;
  float m = -kInf;
  for (int64_t b = 0; b < nb; ++b)
    if (s.bmax[b] > m) {
      m = s.bmax[b];
      L.argmax = s.barg[b];
    }
  if (!(m > -kInf) || m == kInf) {  // nothing finite to sample from, or a +inf logit
    L.degenerate = true;
    return L;
  }
  if (!(temperature > 0.0f)) {  // temperature 0: greedy
    L.done = true;
    return L;
  }
  const float inv_t = 1.0f / temperature;
  float* w = s.w.data();
  r.span = Span{w, nullptr, V};
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    block_exp(x, lo, hi, m, inv_t, w);
    store_positive_stats(s, w, lo, hi, b);
    s.bmax[b] = 1.0f;  // exp(0) at the argmax
  });
  const int64_t arg = L.argmax;
  L = Loaded{};
  combine_load(r, L);
  L.max_w = 1.0f;
  L.argmax = arg;
  return L;
}

template <int P>
void sort_pivots(float* p) {
  for (int i = 1; i < P; ++i)
    for (int j = i; j > 0 && p[j] < p[j - 1]; --j) std::swap(p[j], p[j - 1]);
}

// After stats of ascending pivots: index of the first accepted one (P if none).
template <int P, typename Acc>
int first_accepted(const PivotStats* st, const float* piv, Acc&& accepts) {
  for (int p = 0; p < P; ++p)
    if (accepts(piv[p], st[p])) return p;
  return P;
}

// State of an exact threshold search over the current span; offsets account for the elements
// above `hi` that a bracket compaction dropped.
struct Search {
  float lo, next_lo, hi;
  double mass_lo, mass_hi = 0.0, off_mass = 0.0;
  int64_t cnt_lo, cnt_hi = 0, off_cnt = 0;
};

// Passes of an exact search / rounds of rejection sampling before the exact fallback. Every pass
// halves the key range of the bracket (see sampling_math.h), so ~33 suffice for any row.
constexpr int kPassCap = 64;

// Exact fallback of a search that reached kPassCap (not reachable while the bracket halves every
// pass; it exists so that a capped search still ends with the exact set): sorts the weights inside
// (lo, hi) and walks them upwards with exact counts and masses, then refreshes lo's statistics.
template <typename Acc>
void exact_fallback(Row& r, Search& S, Acc&& accepts) {
  std::vector<float> v;
  for (int64_t j = 0; j < r.span.n; ++j)
    if (r.span.w[j] > S.lo && r.span.w[j] < S.hi) v.push_back(r.span.w[j]);
  std::sort(v.begin(), v.end());
  double mass = S.mass_lo;
  int64_t cnt = S.cnt_lo;
  for (size_t i = 0; i < v.size();) {
    size_t e = i;
    for (; e < v.size() && v[e] == v[i]; ++e) {
      mass -= v[e];
      --cnt;
    }
    PivotStats st;
    st.mass = mass;
    st.cnt = cnt;
    st.min_gt = e < v.size() ? v[e] : S.hi;
    if (accepts(v[i], st)) break;  // v[i] is kept: the kept set is {w > lo}
    S.lo = v[i];
    i = e;
  }
  PivotStats s1;
  r.stats<1>(&S.lo, &s1);
  r.keep_low(0);
  S.mass_lo = s1.mass + S.off_mass;
  S.cnt_lo = s1.cnt + S.off_cnt;
  S.next_lo = s1.min_gt;
}

// Finds the kept set {w > lo} of a monotone filter exactly. Pivots of a pass: next_lo (the
// smallest element above lo), a candidate drawn in proportion to the weights when `draw_rng` is set
// (used only when it falls strictly inside (next_lo, hi): most of the mass usually lies at or above
// hi, where a pivot tells nothing new), and the arithmetic and key midpoints of [next_lo, hi]. The
// key midpoint halves the bracket every pass whatever the other pivots are, which bounds the passes.
// bracket_compact: the span may shrink to the elements in (lo, hi] (exact searches only).
template <typename Acc>
void exact_search(Row& r, Search& S, Acc&& accepts, const RowRng* draw_rng, uint32_t draw_base,
                  bool bracket_compact) {
  for (int pass = 0;; ++pass) {
    if (!(S.next_lo < S.hi)) return;  // every element above lo is accepted
    if (pass == kPassCap) return exact_fallback(r, S, accepts);
    float piv[kMaxPiv];
    const float a = S.next_lo;
    float q = a + (S.hi - a) * 0.25f;
    if (!std::isfinite(q) || !(q >= a) || !(q <= S.hi)) q = a;
    float c = q;
    if (draw_rng) {
      const int64_t pos = r.select(S.lo, static_cast<double>(draw_rng->uniform(draw_base + pass)) *
                                             (S.mass_lo - S.off_mass));
      if (pos >= 0 && r.span.w[pos] > a && r.span.w[pos] < S.hi) c = r.span.w[pos];
    }
    float amid = a + (S.hi - a) * 0.5f;
    if (!std::isfinite(amid) || !(amid >= a) || !(amid <= S.hi)) amid = a;
    piv[0] = a;
    piv[1] = c;
    piv[2] = amid;
    piv[3] = key_midpoint(a, S.hi);
    sort_pivots<kMaxPiv>(piv);
    PivotStats st[kMaxPiv];
    r.stats<kMaxPiv>(piv, st);
    for (int p = 0; p < kMaxPiv; ++p) {
      st[p].mass += S.off_mass;
      st[p].cnt += S.off_cnt;
    }
    const int fa = first_accepted<kMaxPiv>(st, piv, accepts);
    if (fa == 0) return;  // the smallest element above lo is kept
    const int j = fa - 1;
    S.lo = piv[j];
    S.next_lo = st[j].min_gt;
    S.mass_lo = st[j].mass;
    S.cnt_lo = st[j].cnt;
    r.keep_low(j);
    if (fa < kMaxPiv && piv[fa] < S.hi) {
      S.hi = piv[fa];
      S.mass_hi = st[fa].mass;
      S.cnt_hi = st[fa].cnt;
    }
    if (!(S.next_lo < S.hi)) return;
    const int64_t in_bracket = S.cnt_lo - S.cnt_hi;
    if (bracket_compact && r.span.n > kBlock && in_bracket * 8 <= r.span.n) {
      r.compact(S.lo, S.hi);
      S.off_mass = S.mass_hi;
      S.off_cnt = S.cnt_hi;
    } else if (!bracket_compact && r.span.n > kBlock && (S.cnt_lo - S.off_cnt) * 8 <= r.span.n) {
      r.compact(S.lo);
    } else {
      continue;
    }
    // partials of lo over the new span, for select()
    PivotStats s1;
    r.stats<1>(&S.lo, &s1);
    r.keep_low(0);
  }
}

struct RowResult {
  int64_t token = 0;
  bool valid = true;
};

// Draws one token from the loaded row under filter f (see sampling_math.h for the rules).
RowResult sample_loaded(Row& r, const Loaded& L, RowFilter f, const RowRng& rng) {
  if (L.done) return {L.argmax, true};
  if (L.degenerate) return {L.argmax, false};
  uint32_t draw = 0;
  float low = 0.0f, high = L.max_w;
  double mass_low = L.mass, ref = L.mass;
  int64_t cnt_low = L.cnt;
  bool need_k = f.k > 0 && f.k < L.cnt;
  const bool need_p = f.has_p();
  if (f.has_min_p()) {
    const float tau = min_p_threshold(f.min_p, L.max_w);
    if (tau > 0.0f) {
      low = float_below(tau);
      PivotStats st;
      r.stats<1>(&low, &st);
      r.keep_low(0);
      mass_low = st.mass;
      cnt_low = st.cnt;
    }
  }
  if (need_k && (f.k_first || !need_p)) {
    // The top-k set is found exactly first (top_k_first: the top-p mass is relative to it), then
    // the draw is made inside it: the one-pass path of small_k_cpu.h replays exactly this.
    Search S{0.0f, L.min_pos, L.max_w, L.mass, 0.0, 0.0, L.cnt, 0, 0};
    const int64_t k = f.k;
    exact_search(r, S, [k](float, const PivotStats& st) { return topk_accepts(k, st.cnt); }, &rng,
                 0x80000000u, /*bracket_compact=*/false);
    low = S.lo;
    mass_low = S.mass_lo;
    cnt_low = S.cnt_lo;
    ref = S.mass_lo;
    need_k = false;
    if (r.span.n > kBlock && cnt_low * 8 <= r.span.n) {
      r.compact(low);
      PivotStats s1;
      r.stats<1>(&low, &s1);
      r.keep_low(0);
      mass_low = s1.mass;
    }
  }
  if (!need_k && !need_p) {
    const int64_t pos = r.select(low, static_cast<double>(rng.uniform(draw)) * mass_low);
    if (pos < 0) return {L.argmax, false};
    return {r.span.token(pos), true};
  }
  const int64_t k = need_k ? f.k : 0;
  const float top_p = need_p ? f.top_p : 1.0f;
  auto accepts = [&](float, const PivotStats& st) {
    return topk_accepts(k, st.cnt) && topp_accepts(top_p, st.mass, ref);
  };
  int64_t pos = -1;
  for (int round = 0; round < kPassCap; ++round) {
    pos = r.select(low, static_cast<double>(rng.uniform(draw++)) * mass_low);
    if (pos < 0) return {L.argmax, false};
    const float v0 = r.span.w[pos];
    if (!(v0 < high)) return {r.span.token(pos), true};  // at or above a known-accepted weight
    // candidate, key midpoint (bounds the rounds), arithmetic midpoint (fast for peaked rows)
    float piv[3] = {v0, round_pivot(v0, high), v0 + (high - v0) * 0.5f};
    sort_pivots<3>(piv);
    PivotStats st[3];
    r.stats<3, false>(piv, st);
    const int fa = first_accepted<3>(st, piv, accepts);
    if (fa == 0) return {r.span.token(pos), true};
    low = piv[fa - 1];
    mass_low = st[fa - 1].mass;
    cnt_low = st[fa - 1].cnt;
    r.keep_low(fa - 1);
    if (fa < 3) high = std::min(high, piv[fa]);
    if (r.span.n > kBlock && cnt_low * 8 <= r.span.n) {
      r.compact(low);
      PivotStats s1;
      r.stats<1>(&low, &s1);
      r.keep_low(0);
      mass_low = s1.mass;
    }
  }
  // Not reached: every rejection halves the key range of (low, high]. Were the cap hit, the kept
  // set is found exactly and the draw made from it, never from a rejected candidate.
  PivotStats s0;
  r.stats<1>(&low, &s0);
  r.keep_low(0);
  Search S{low, s0.min_gt, high, s0.mass, 0.0, 0.0, s0.cnt, 0, 0};
  exact_search(r, S, accepts, nullptr, 0, /*bracket_compact=*/false);
  pos = r.select(S.lo, static_cast<double>(rng.uniform(draw)) * S.mass_lo);
  if (pos < 0) return {L.argmax, false};
  return {r.span.token(pos), true};
}

// Rows that take the one-pass path of small_k_cpu.h: small k, top-p (if any) relative to the
// top-k set, no min-p, and a positive temperature for logits.
bool small_k_eligible(const RowFilter& f, int64_t V, float temperature) {
  return f.k > 0 && f.k <= kSmallK && 4 * f.k <= V && !f.has_min_p() && (!f.has_p() || f.k_first) &&
         temperature > 0.0f && std::isfinite(temperature);
}

template <typename T>
const T* row_ptr(const TensorView& x, int64_t r) {
  return reinterpret_cast<const T*>(x.bytes() + r * x.stride(0) * static_cast<int64_t>(x.elem_size()));
}
template <typename T>
T* row_ptr_mut(const TensorView& x, int64_t r) {
  return reinterpret_cast<T*>(x.bytes() + r * x.stride(0) * static_cast<int64_t>(x.elem_size()));
}

}  // namespace

void sample_rows(const SampleArgs& a) {
  const int64_t V = a.x.size(1);
  dispatch_float(a.x.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    run_rows(a.batch, V, [&](const Team& t, Shared& s, int64_t i) {
      Row r(t, s);
      const int64_t src = a.indices ? index_of(*a.indices, i) : i;
      const T* x = row_ptr<T>(a.x, src);
      RowFilter f{param_i(a.top_k, i), static_cast<float>(param_f(a.top_p, i)),
                  static_cast<float>(param_f(a.min_p, i)), a.k_first};
      const RowRng rng = RowRng::make(param_u64(a.seed, i), param_u64(a.offset, i), static_cast<uint32_t>(i));
      const float temp = a.is_logits ? static_cast<float>(param_f(a.temperature, i)) : 1.0f;
      if (small_k_eligible(f, V, temp)) {
        // one pass by the team's leader (the result must not depend on the team size)
        Shared& s = r.shared();
        if (r.leader()) {
          int64_t tok = -1;
          s.fast_token = sample_small_k(x, V, a.is_logits, temp, f.k, f.top_p, rng, tok) ? tok : -1;
        }
        r.sync();
        if (s.fast_token >= 0) {
          if (r.leader()) {
            write_index(a.out, i, s.fast_token);
            a.valid.ptr<bool>()[i] = true;
          }
          return;
        }
      }
      Loaded L = a.is_logits ? load_logits(r, x, V, temp) : load_probs(r, x, V);
      const RowResult res = sample_loaded(r, L, f, rng);
      if (r.leader()) {
        write_index(a.out, i, res.token);
        a.valid.ptr<bool>()[i] = res.valid;
      }
    });
  });
}

void renorm_rows(const RenormArgs& a) {
  const int64_t V = a.x.size(1), batch = a.x.size(0);
  dispatch_float(a.x.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    run_rows(batch, V, [&](const Team& t, Shared& s, int64_t i) {
      Row r(t, s);
      const T* x = row_ptr<T>(a.x, i);
      T* out = row_ptr_mut<T>(a.out, i);
      const int64_t nb = (V + kBlock - 1) / kBlock;
      if (a.kind == RenormKind::MaskLogitsTopK) {
        // Exact top-k threshold on the logits themselves (signed; -inf and NaN never counted).
        const float* w = row_weights(x, s);
        r.span = Span{w, nullptr, V};
        r.sync();
        r.for_blocks(nb, [&](int64_t b) {
          const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
          if constexpr (!std::is_same_v<T, float>) block_convert(x, lo, hi, s.w.data());
          const float ninf = -kInf;
          float mass, mn;
          int32_t cnt;
          block_stats<1>(w, lo, hi, &ninf, &mass, &cnt, &mn);
          s.bcnt[b] = cnt;
          s.bmin[b] = mn;
          s.bmass[b] = 0.0f;
          block_max_arg(w, lo, hi, s.bmax[b], s.barg[b]);
        });
        int64_t cnt = 0;
        float mn = kInf, mx = -kInf;
        for (int64_t b = 0; b < nb; ++b) {
          cnt += s.bcnt[b];
          mn = std::min(mn, s.bmin[b]);
          mx = std::max(mx, s.bmax[b]);
        }
        const int64_t k = param_i(a.param, i);
        Search S{-kInf, mn, mx, 0.0, 0.0, 0.0, cnt, 0, 0};
        if (k > 0 && k < cnt)
          exact_search(r, S, [k](float, const PivotStats& st) { return topk_accepts(k, st.cnt); },
                       nullptr, 0, /*bracket_compact=*/true);
        const float lo = (k > 0 && k < cnt) ? S.lo : -kInf;
        r.sync();
        r.for_blocks(nb, [&](int64_t b) {
          for (int64_t j = b * kBlock, e = std::min(V, (b + 1) * kBlock); j < e; ++j) {
            if (to_f(x[j]) > lo) out[j] = x[j];
            else from_f(-kInf, &out[j]);
          }
        });
        return;
      }
      Loaded L = load_probs(r, x, V);
      const float* w0 = r.span.w;  // the row's weights, before any compaction
      double kept_mass = L.mass;
      float lo = 0.0f;
      if (!L.degenerate) {
        Search S{0.0f, L.min_pos, L.max_w, L.mass, 0.0, 0.0, L.cnt, 0, 0};
        const RowRng rng = RowRng::make(0x9e3779b97f4a7c15ull, 0, static_cast<uint32_t>(i));
        if (a.kind == RenormKind::TopK) {
          const int64_t k = param_i(a.param, i);
          if (k > 0 && k < L.cnt)
            exact_search(r, S, [k](float, const PivotStats& st) { return topk_accepts(k, st.cnt); },
                         &rng, 0, /*bracket_compact=*/true);
        } else {
          const float p = static_cast<float>(param_f(a.param, i));
          const double total = L.mass;
          if (p < 1.0f)
            exact_search(r, S, [p, total](float, const PivotStats& st) { return topp_accepts(p, st.mass, total); },
                         &rng, 0, /*bracket_compact=*/true);
        }
        lo = S.lo;
        kept_mass = S.mass_lo;
      }
      const double inv = (L.degenerate || !(kept_mass > 0.0)) ? 0.0 : 1.0 / kept_mass;
      r.sync();
      r.for_blocks(nb, [&](int64_t b) {
        for (int64_t j = b * kBlock, e = std::min(V, (b + 1) * kBlock); j < e; ++j)
          from_f(renorm_value(w0[j], lo, inv), &out[j]);
      });
    });
  });
}

LLMK_NS_END
