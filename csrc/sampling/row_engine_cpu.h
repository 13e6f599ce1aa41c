// CPU machinery for one row of a sampling op: a "team" of threads (one thread when rows run in
// parallel, all threads when a few long rows are split), passes over fixed 2048-element blocks of
// the row (vectorised lane loops), pivot statistics, inverse-CDF selection and compaction.
//
// Determinism: every reduction is computed per block (fixed partition of the row, independent of
// the team size) and the block partials are combined in block order by every thread of the team.
// All threads therefore take the same decisions, and a row gives the same result with 1 or N
// threads. Included only by *_cpu.cpp files (one copy per SIMD level).
// The block size, the team, the row's working set and the block loops are in row_blocks_cpu.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/exp_cpu.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"
#include "common/tensor.h"
#include "sampling/sampling.h"
#include "sampling/row_algo.h"
#include "sampling/sampling_math.h"
#include "sampling/row_blocks_cpu.h"

LLMK_NS_BEGIN
namespace rowcpu {

// ---- the row: a team's view of one row ----------------------------------------------------------

class Row {
 public:
  Row(const Team& t, Shared& s) : t_(t), s_(s) {}

  Span span;

  // Runs f(b) for the blocks of this thread, then waits for the team.
  template <typename F>
  void for_blocks(int64_t nb, F&& f) {
    for (int64_t b = t_.tid; b < nb; b += t_.nt) f(b);
    t_.sync();
  }
  void sync() const { t_.sync(); }
  bool leader() const { return t_.tid == 0; }

  // Statistics of P pivots over the span (per-block partials left in the shared buffers).
  template <int P, bool WantMin = true>
  void stats(const float* piv, PivotStats* out) {
    sync();  // everyone is done reading the partials of the previous pass
    const int64_t nb = span.nblocks();
    const float* w = span.w;
    const int64_t n = span.n;
    for_blocks(nb, [&](int64_t b) {
      float mass[P], mn[P];
      int32_t cnt[P];
      block_stats<P, WantMin>(w, b * kBlock, std::min(n, (b + 1) * kBlock), piv, mass, cnt, mn);
      for (int p = 0; p < P; ++p) {
        s_.bmass[p * nb + b] = mass[p];
        s_.bcnt[p * nb + b] = cnt[p];
        s_.bmin[p * nb + b] = mn[p];
      }
    });
    for (int p = 0; p < P; ++p) {
      PivotStats st;
      for (int64_t b = 0; b < nb; ++b) {
        st.mass += static_cast<double>(s_.bmass[p * nb + b]);
        st.cnt += s_.bcnt[p * nb + b];
        st.min_gt = std::min(st.min_gt, s_.bmin[p * nb + b]);
      }
      out[p] = st;
    }
  }

  // Private copy of the per-block mass / count of pivot p of the last stats() call: the partials
  // of the current lower pivot. Must be called before the next pass (then sync()).
  void keep_low(int p) {
    const int64_t nb = span.nblocks();
    low_mass_.assign(s_.bmass.begin() + p * nb, s_.bmass.begin() + (p + 1) * nb);
    low_cnt_.assign(s_.bcnt.begin() + p * nb, s_.bcnt.begin() + (p + 1) * nb);
  }

  // Inverse-CDF selection in {w > low}: the first position whose running mass exceeds target.
  // Block partials locate the block; 16-element chunks then elements locate the position.
  // Floating-point running sums computed in different orders disagree by rounding, so a scan may
  // run past the end without crossing: it then returns the last element above low that it saw.
  int64_t select_pos(float low, double target) const {
    const int64_t nb = span.nblocks();
    double acc = 0.0;
    int64_t b = -1, last_b = -1;
    for (int64_t i = 0; i < nb; ++i) {
      const double m = low_mass_[i];
      if (!(m > 0.0)) continue;
      last_b = i;
      if (acc + m > target) {
        b = i;
        break;
      }
      acc += m;
    }
    if (b < 0) {
      if (last_b < 0) return -1;
      b = last_b;
      acc -= low_mass_[b];
    }
    const float* w = span.w;
    const int64_t lo = b * kBlock, hi = std::min(span.n, lo + kBlock);
    int64_t last = -1, j = lo;
    for (; j + kL <= hi; j += kL) {
      const float cm = chunk_mass(w + j, low);
      if (!(cm > 0.0f)) continue;
      if (acc + cm > target) {
        for (int l = 0; l < kL; ++l) {
          const float x = w[j + l];
          if (!(x > low)) continue;
          last = j + l;
          acc += x;
          if (acc > target) return j + l;
        }
      } else {
        acc += cm;
        for (int l = kL - 1; l >= 0; --l)
          if (w[j + l] > low) {
            last = j + l;
            break;
          }
      }
    }
    for (; j < hi; ++j) {
      const float x = w[j];
      if (!(x > low)) continue;
      last = j;
      acc += x;
      if (acc > target) return j;
    }
    return last;
  }

  // ---- the row interface of row_algo.h ----

  void set_low(int p) { keep_low(p); }
  Pick select(float low, double target) const {
    const int64_t pos = select_pos(low, target);
    return pos < 0 ? Pick{-1, 0.0f} : Pick{span.token(pos), span.w[pos]};
  }
  // The working set shrinks to {w > low} once that is at most an eighth of it.
  void narrowed(float low, int64_t cnt_low, double& mass_low) {
    if (!(span.n > kBlock && cnt_low * 8 <= span.n)) return;
    compact(low);
    mass_low = refresh_low(low).mass;
  }
  // A candidate from {w > lo} of the working set (with bracket compaction: from (lo, hi]).
  float bracket_draw(const Search& S, float u) const {
    const int64_t pos = select_pos(S.lo, static_cast<double>(u) * (S.mass_lo - S.off_mass));
    return pos >= 0 ? span.w[pos] : NAN;
  }
  // compact: the working set may shrink to the bracket (lo, hi] (what lies above hi is then
  // carried as an offset); otherwise to {w > lo}.
  void search_narrowed(Search& S, bool compact_bracket) {
    if (!(span.n > kBlock)) return;
    if (compact_bracket && (S.cnt_lo - S.cnt_hi) * 8 <= span.n) {
      compact(S.lo, S.hi);
      S.off_mass = S.mass_hi;
      S.off_cnt = S.cnt_hi;
    } else if (!compact_bracket && (S.cnt_lo - S.off_cnt) * 8 <= span.n) {
      compact(S.lo);
    } else {
      return;
    }
    refresh_low(S.lo);  // partials of lo over the new span, for select()
  }
  // Exact fallback of a search that reached kPassCap (not reachable while the bracket halves every
  // pass; it exists so that a capped search still ends with the exact set): sorts the weights
  // inside (lo, hi) and walks them upwards with exact counts and masses.
  template <class Acc>
  void search_fallback(Search& S, const Acc& accepts) {
    std::vector<float> v;
    for (int64_t j = 0; j < span.n; ++j)
      if (span.w[j] > S.lo && span.w[j] < S.hi) v.push_back(span.w[j]);
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
      if (accepts(st)) break;  // v[i] is kept: the kept set is {w > lo}
      S.lo = v[i];
      i = e;
    }
    const PivotStats s1 = refresh_low(S.lo);
    S.mass_lo = s1.mass + S.off_mass;
    S.cnt_lo = s1.cnt + S.off_cnt;
    S.next_lo = s1.min_gt;
  }
  // The top-k set by an exact pivot search (its statistics come with it).
  Threshold topk_set(int64_t k, const Search& dom, const RowRng* rng, uint32_t draw_base, bool compact_bracket,
                     bool) {
    Search S = dom;
    exact_search(*this, S, TopKAcc{k}, rng, draw_base, compact_bracket);
    return {S.lo, S.mass_lo, S.cnt_lo};
  }

  // Replaces the span by its elements above `low` (and, when upto is finite, at most `upto`),
  // using the per-block counts of `low` kept by keep_low() when upto is infinite.
  void compact(float low, float upto = kInf) {
    const int64_t nb = span.nblocks();
    const float* w = span.w;
    const int32_t* idx = span.idx;
    const int64_t n = span.n;
    const int buf = (w == s_.cw[0].data()) ? 1 : 0;
    sync();
    float* dw = s_.cw[buf].data();
    int32_t* di = s_.ci[buf].data();
    // block offsets: from the kept counts, or from a counting pass when bounded above
    std::vector<int64_t>& off = off_;
    off.assign(nb + 1, 0);
    if (upto < kInf) {
      for_blocks(nb, [&](int64_t b) {
        int32_t c = 0;
        for (int64_t j = b * kBlock, e = std::min(n, (b + 1) * kBlock); j < e; ++j)
          c += (w[j] > low && w[j] <= upto) ? 1 : 0;
        s_.bcnt[b] = c;
      });
      for (int64_t b = 0; b < nb; ++b) off[b + 1] = off[b] + s_.bcnt[b];
      sync();
    } else {
      for (int64_t b = 0; b < nb; ++b) off[b + 1] = off[b] + low_cnt_[b];
    }
    for_blocks(nb, [&](int64_t b) {
      int64_t o = off[b];
      for (int64_t j = b * kBlock, e = std::min(n, (b + 1) * kBlock); j < e; ++j) {
        const float x = w[j];
        if (x > low && x <= upto) {
          dw[o] = x;
          di[o] = static_cast<int32_t>(idx ? idx[j] : j);
          ++o;
        }
      }
    });
    span = Span{dw, di, off[nb]};
  }

 private:
  const Team& t_;
  Shared& s_;
  std::vector<double> low_mass_;
  std::vector<int32_t> low_cnt_;
  std::vector<int64_t> off_;

 public:
  // Statistics of `low` over the span, kept as the selection partials.
  PivotStats refresh_low(float low) {
    PivotStats s1;
    stats<1>(&low, &s1);
    keep_low(0);
    return s1;
  }
  // Set the partials of `low` directly (load pass results).
  std::vector<double>& low_mass_blocks() { return low_mass_; }
  std::vector<int32_t>& low_cnt_blocks() { return low_cnt_; }
  Shared& shared() { return s_; }
  const Team& team() const { return t_; }
};

// Runs row_fn(team, shared, i) for i in [0, batch): rows in parallel when there are enough of
// them, otherwise every thread works on each (long) row.
template <typename F>
inline void run_rows(int64_t batch, int64_t V, F&& row_fn) {
  if (batch <= 0) return;
  const int nt = max_threads();
  // Splitting a row costs a few team barriers per pass: worth it for very long rows only (and
  // painful when the machine is oversubscribed, where a barrier can wait for a descheduled thread).
  const bool split_rows = nt > 1 && batch < nt && V >= kSplitRowMinVocab;
  if (!split_rows) {
    parallel_for(batch, 1, [&](int64_t b, int64_t e) {
      Shared& s = thread_shared(V);
      const Team t{0, 1};
      for (int64_t i = b; i < e; ++i) row_fn(t, s, i);
    });
    return;
  }
  Shared& s = thread_shared(V);
  parallel_team(nt, [&](int tid, int n) {
    const Team t{tid, n};
    for (int64_t i = 0; i < batch; ++i) {
      row_fn(t, s, i);
      t.sync();  // the shared buffers are reused by the next row
    }
  });
}

// ---- per-row parameters -----------------------------------------------------------------------

inline double param_f(const RowParam& p, int64_t i) {
  if (!p.arr) return p.val;
  const TensorView& a = *p.arr;
  const int64_t j = a.numel() == 1 ? 0 : i;
  switch (a.dtype) {
    case DType::F32: return a.ptr<const float>()[j];
    case DType::F64: return a.ptr<const double>()[j];
    case DType::I32: return a.ptr<const int32_t>()[j];
    case DType::I64: return static_cast<double>(a.ptr<const int64_t>()[j]);
    default: return p.val;
  }
}
inline int64_t param_i(const RowParam& p, int64_t i) {
  if (!p.arr) return static_cast<int64_t>(p.val);
  const TensorView& a = *p.arr;
  const int64_t j = a.numel() == 1 ? 0 : i;
  if (a.dtype == DType::I64) return a.ptr<const int64_t>()[j];
  if (a.dtype == DType::I32) return a.ptr<const int32_t>()[j];
  return static_cast<int64_t>(param_f(p, i));
}
inline uint64_t param_u64(const RowParam& p, int64_t i) {
  if (!p.arr) return p.uval;
  const TensorView& a = *p.arr;
  const int64_t j = a.numel() == 1 ? 0 : i;
  return a.dtype == DType::I64 ? static_cast<uint64_t>(a.ptr<const int64_t>()[j])
                               : static_cast<uint64_t>(static_cast<uint32_t>(a.ptr<const int32_t>()[j]));
}

inline int64_t index_of(const TensorView& t, int64_t i) {
  return t.dtype == DType::I64 ? t.ptr<const int64_t>()[i] : t.ptr<const int32_t>()[i];
}

inline void write_index(const TensorView& out, int64_t i, int64_t v) {
  if (out.dtype == DType::I64) out.ptr<int64_t>()[i] = v;
  else out.ptr<int32_t>()[i] = static_cast<int32_t>(v);
}

}  // namespace rowcpu
LLMK_NS_END
