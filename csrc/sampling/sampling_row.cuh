// CUDA row engine of the sampling kernels: one CTA owns one row and streams it from global memory
// (16-byte vector loads) once per pass. A pass either computes statistics of a few pivots
// (mass, count and smallest element strictly above each) or locates an inverse-CDF position
// (block scan per chunk, stopping at the chunk that crosses the target). Every decision is taken
// from block-wide results that all threads read in the same order, so control flow is uniform
// across the CTA. The per-row algorithms (which pivots, how the bracket narrows) are row_algo.h's,
// shared with the CPU kernels, over the passes of DeviceRow below, so both backends draw the same
// tokens for the same seed whenever their floating-point sums agree.
// No global scratch: weights are recomputed from the input on every pass (for logits,
// exp((x - max) / T)), which keeps the kernels allocation-free and graph-capturable.
#pragma once
#include <climits>
#include <cstdint>

#include "common/simt.h"
#include "common/simt_block.h"
#include "sampling/row_algo.h"
#include "sampling/sampling_math.h"

namespace llmk {
namespace gpu {
namespace samp {

constexpr int kMaxPivots = 4;
constexpr int kMaxThreads = 512;  // 128 registers per thread; 32 KiB of loads in flight per CTA

// ---- element types ---------------------------------------------------------------------------------

LLMK_DEVICE float to_f(float x) { return x; }
LLMK_DEVICE float to_f(__half x) { return __half2float(x); }
LLMK_DEVICE float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
LLMK_DEVICE void from_f(float v, float* d) { *d = v; }
LLMK_DEVICE void from_f(float v, __half* d) { *d = __float2half_rn(v); }
LLMK_DEVICE void from_f(float v, __nv_bfloat16* d) { *d = __float2bfloat16_rn(v); }

LLMK_HD bool finite_f(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

LLMK_DEVICE bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elements [v * N, v * N + N) of a row as fp32; positions past the end read as -inf (never above a
// pivot). One 16-byte load when the row start is 16-byte aligned, element loads otherwise. With a
// token bitmask row, disallowed positions read `fill` (one mask word per vector: N divides 32).
template <typename T>
struct RowLoader {
  static constexpr int N = 16 / static_cast<int>(sizeof(T));
  const T* row;
  int64_t V;
  bool vec;
  const int32_t* mask = nullptr;
  float fill = 0.0f;

  LLMK_DEVICE RowLoader(const T* r, int64_t v) : row(r), V(v), vec(aligned16(r)) {}
  LLMK_DEVICE RowLoader(const T* r, int64_t v, const int32_t* m, float f)
      : row(r), V(v), vec(aligned16(r)), mask(m), fill(f) {}
  LLMK_DEVICE int64_t nvec() const { return (V + N - 1) / N; }
  LLMK_DEVICE void load(int64_t v, float (&w)[N]) const {
    const int64_t j0 = v * N;
    if (vec && j0 + N <= V) {
      const uint4 u = *reinterpret_cast<const uint4*>(row + j0);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < N; ++i) w[i] = to_f(e[i]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) w[i] = j0 + i < V ? to_f(row[j0 + i]) : -INFINITY;
    }
    if (mask && j0 < V) {
      const uint32_t bits = static_cast<uint32_t>(mask[j0 >> 5]) >> (j0 & 31);
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (!((bits >> i) & 1u) && j0 + i < V) w[i] = fill;
    }
  }
};

// Weights of a row of probabilities (or of raw logits, for the top-k mask): the values themselves
// (`fill` where a bitmask disallows the token: 0 for probabilities, -inf for logits).
template <typename T>
struct ProbsSrc {
  static constexpr int N = RowLoader<T>::N;
  RowLoader<T> ld;
  LLMK_DEVICE ProbsSrc(const T* r, int64_t V, const int32_t* mask = nullptr, float fill = 0.0f)
      : ld(r, V, mask, fill) {}
  LLMK_DEVICE int64_t nvec() const { return ld.nvec(); }
  LLMK_DEVICE void load(int64_t v, float (&w)[N]) const { ld.load(v, w); }
};

// Weights of a row of logits: exp((x - max) * inv_t) * inv_s, NaN -> 0; flushed to 0 below e^-87
// (the CPU kernels flush below 2^-126 of each block's maximum, then rescale: the two backends' sets
// of positive weights differ only in weights within rounding of e^-87 of the top one). inv_s = 1 / sum
// normalises them to the softmax (softmax_rows writes exactly these values). Tokens a bitmask
// disallows read as -inf logits, weight 0.
template <typename T>
struct LogitsSrc {
  static constexpr int N = RowLoader<T>::N;
  RowLoader<T> ld;
  float m, inv_t, inv_s = 1.0f;
  LLMK_DEVICE LogitsSrc(const T* r, int64_t V, float mx, float it, const int32_t* mask = nullptr)
      : ld(r, V, mask, -INFINITY), m(mx), inv_t(it) {}
  LLMK_DEVICE int64_t nvec() const { return ld.nvec(); }
  LLMK_DEVICE void load(int64_t v, float (&w)[N]) const {
    ld.load(v, w);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float t = (w[i] - m) * inv_t;
      w[i] = (w[i] == w[i] && t >= -87.0f) ? __expf(t) * inv_s : 0.0f;
    }
  }
};

// ---- per-row parameters on the device ---------------------------------------------------------------

// A RowParam as kernels read it: a device array ([1] or [batch]) or a scalar.
struct DParam {
  const void* p;
  int dt;  // 1 f32, 2 f64, 3 i32, 4 i64
  int one; // the array has one entry for every row
  double val;
  unsigned long long uval;

  LLMK_DEVICE int64_t at(int64_t i) const { return one ? 0 : i; }
  LLMK_DEVICE double f(int64_t i) const {
    if (!p) return val;
    switch (dt) {
      case 1: return static_cast<const float*>(p)[at(i)];
      case 2: return static_cast<const double*>(p)[at(i)];
      case 3: return static_cast<const int32_t*>(p)[at(i)];
      default: return static_cast<double>(static_cast<const int64_t*>(p)[at(i)]);
    }
  }
  LLMK_DEVICE int64_t i64(int64_t i) const {
    if (!p) return static_cast<int64_t>(val);
    if (dt == 4) return static_cast<const int64_t*>(p)[at(i)];
    if (dt == 3) return static_cast<const int32_t*>(p)[at(i)];
    return static_cast<int64_t>(f(i));
  }
  LLMK_DEVICE uint64_t u64(int64_t i) const {
    if (!p) return uval;
    if (dt == 4) return static_cast<uint64_t>(static_cast<const int64_t*>(p)[at(i)]);
    return static_cast<uint64_t>(static_cast<uint32_t>(static_cast<const int32_t*>(p)[at(i)]));
  }
};

LLMK_DEVICE int64_t read_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// ---- passes ------------------------------------------------------------------------------------------

// Vectors a thread loads before using any of them: 4 x 16 bytes in flight per thread.
constexpr int kUnroll = 4;

// f(v, w) for this thread's vectors v = tid, tid + T, tid + 2T, ... (in that order: the partition
// of the row and the order of each thread's sums do not depend on the unrolling). Loads past the
// end read -inf.
template <typename Src, typename F>
LLMK_DEVICE void for_each_vec(const Src& src, F&& f) {
  constexpr int N = Src::N;
  const int64_t nv = src.nvec(), T = blockDim.x;
  for (int64_t v0 = threadIdx.x; v0 < nv; v0 += T * kUnroll) {
    float w[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) src.load(v0 + u * T, w[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(v0 + u * T, w[u]);
  }
}

// ---- block-wide results ------------------------------------------------------------------------------

// Shared memory of one row (static size, one per CTA).
struct RowSmem {
  float mass[kMaxPivots][32];
  int cnt[kMaxPivots][32];
  float mn[kMaxPivots][32];
  float scan[32];
  int ired[32];
  long long lred[32];
  unsigned long long ured[32];
  long long sel_pos;
  float sel_w;
  int hist[2048];
  int digit, remaining;
};

// Warp sums of (mass, count) travel as one 64-bit shuffle.
LLMK_DEVICE unsigned long long pack_mc(float m, int c) {
  return (static_cast<unsigned long long>(static_cast<uint32_t>(c)) << 32) | float_bits(m);
}

// Block reduction of P pivots' per-thread partials. Warp totals are combined in warp order in
// double by every thread, so all threads hold identical results.
template <int P, bool WantMin>
LLMK_DEVICE void reduce_stats(float (&m)[P], int (&c)[P], float (&mn)[P], PivotStats* out, RowSmem& sm) {
  const int lane = simt::lane_id(), warp = simt::warp_id(), nw = static_cast<int>(blockDim.x) >> 5;
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, pack_mc(m[p], c[p]), o);
      m[p] += bits_float(static_cast<uint32_t>(other));
      c[p] += static_cast<int>(static_cast<uint32_t>(other >> 32));
      if (WantMin) mn[p] = fminf(mn[p], __shfl_xor_sync(0xffffffffu, mn[p], o));
    }
  }
  __syncthreads();  // readers of the previous reduction are done
  if (lane == 0) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      sm.mass[p][warp] = m[p];
      sm.cnt[p][warp] = c[p];
      sm.mn[p][warp] = mn[p];
    }
  }
  __syncthreads();
#pragma unroll
  for (int p = 0; p < P; ++p) {
    PivotStats s;
    for (int w = 0; w < nw; ++w) {
      s.mass += static_cast<double>(sm.mass[p][w]);
      s.cnt += sm.cnt[p][w];
      if (WantMin) s.min_gt = fminf(s.min_gt, sm.mn[p][w]);
    }
    out[p] = s;
  }
}

// Statistics of P pivots over the whole row.
template <int P, bool WantMin, typename Src>
LLMK_DEVICE void row_stats(const Src& src, const float* piv, PivotStats* out, RowSmem& sm) {
  constexpr int N = Src::N;
  float m[P], mn[P];
  int c[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    m[p] = 0.0f;
    c[p] = 0;
    mn[p] = INFINITY;
  }
  for_each_vec(src, [&](int64_t, const float (&w)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (w[e] > piv[p]) {
          m[p] += w[e];
          c[p] += 1;
          if (WantMin) mn[p] = fminf(mn[p], w[e]);
        }
      }
    }
  });
  reduce_stats<P, WantMin>(m, c, mn, out, sm);
}

// The first load of a row: statistics of {w > p0} and the maximum with the first index reaching it
// (NaN ignored; index 0 and -inf when nothing is above -inf).
struct RowMax {
  float max_w;
  int64_t argmax;
};

LLMK_DEVICE unsigned long long pack_max(float v, int64_t j) {
  return j < 0 ? 0ull
               : (static_cast<unsigned long long>(order_key(v)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(j));
}

template <typename Src>
LLMK_DEVICE RowMax row_load(const Src& src, float p0, PivotStats* st, RowSmem& sm) {
  constexpr int N = Src::N;
  float m[1] = {0.0f}, mn[1] = {INFINITY};
  int c[1] = {0};
  float best = -INFINITY;
  int64_t arg = -1;
  for_each_vec(src, [&](int64_t v, const float (&w)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if (w[e] > p0) {
        m[0] += w[e];
        c[0] += 1;
        mn[0] = fminf(mn[0], w[e]);
      }
      if (w[e] > best) {
        best = w[e];
        arg = v * N + e;
      }
    }
  });
  if (st) reduce_stats<1, true>(m, c, mn, st, sm);
  const unsigned long long k = simt::block_allreduce(pack_max(best, arg), sm.ured, simt::MaxOp(), 0ull);
  if (k == 0ull) return {-INFINITY, 0};
  return {key_to_float(static_cast<uint32_t>(k >> 32)), static_cast<int64_t>(~static_cast<uint32_t>(k))};
}

// Inverse-CDF selection among the weights in (low, hi]: the first position (vocabulary order)
// whose running mass exceeds target. Chunks of blockDim * N elements are scanned in order; the
// chunk that crosses the target is searched thread by thread. When rounding keeps the running sum
// from crossing, the last weight in range is returned (pos = -1: nothing in range).
template <typename Src>
LLMK_DEVICE Pick row_select(const Src& src, float low, float hi, double target, RowSmem& sm) {
  constexpr int N = Src::N;
  const int tid = threadIdx.x;
  const int64_t nv = src.nvec(), T = blockDim.x;
  double acc = 0.0;
  int64_t my_last = -1;
  float my_last_w = 0.0f;
  // Chunks of kUnroll slabs of T vectors (all loads of a chunk issued first); slabs are scanned
  // in order, vector v = slab start + tid.
  for (int64_t c0 = 0; c0 < nv; c0 += T * kUnroll) {
    float w[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) src.load(c0 + u * T + tid, w[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u * T >= nv) break;  // uniform
      const int64_t v = c0 + u * T + tid;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (w[u][e] > low && w[u][e] <= hi) {
          s += w[u][e];
          my_last = v * N + e;
          my_last_w = w[u][e];
        }
      }
      float total;
      const float incl = block_inclusive_scan(s, sm.scan, &total);
      if (!(total > 0.0f)) continue;
      if (acc + static_cast<double>(total) > target) {
        const bool pred = s > 0.0f && acc + static_cast<double>(incl) > target;
        int first = simt::block_allreduce(pred ? tid : INT_MAX, sm.ired, simt::MinOp(), INT_MAX);
        if (first == INT_MAX)  // rounding: the scan total crossed but no thread's prefix did
          first = simt::block_allreduce(s > 0.0f ? tid : -1, sm.ired, simt::MaxOp(), -1);
        if (tid == first) {
          double r = acc + static_cast<double>(incl - s);
          int64_t pick = -1;
          float pw = 0.0f;
          for (int e = 0; e < N; ++e) {
            if (w[u][e] > low && w[u][e] <= hi) {
              r += w[u][e];
              pick = v * N + e;
              pw = w[u][e];
              if (r > target) break;
            }
          }
          sm.sel_pos = pick;
          sm.sel_w = pw;
        }
        __syncthreads();
        const Pick res{sm.sel_pos, sm.sel_w};
        __syncthreads();  // sel_* may be rewritten by the next call
        return res;
      }
      acc += static_cast<double>(total);
    }
  }
  const long long last = simt::block_allreduce(static_cast<long long>(my_last), sm.lred, simt::MaxOp(), -1ll);
  if (last < 0) return Pick{-1, 0.0f};
  if (my_last == last) sm.sel_w = my_last_w;
  __syncthreads();
  const Pick res{last, sm.sel_w};
  __syncthreads();
  return res;
}

// The k-th largest weight among those above dom_lo (1 <= k <= their count), by radix selection on
// the order-preserving keys: three passes (digits of 11, 11 and 10 bits, from the top), each a
// shared-memory histogram of the elements that match the digits chosen so far, then a descending
// block scan of the bins to find the digit holding the k-th element. Wide first digits spread a
// row's weights (which share sign and top exponent bits) over many bins, which keeps the
// shared-memory atomics of the first pass mostly conflict-free. The top-k set (ties included) is
// then {w >= result} = {w > float_below(result)}.
template <typename Src>
LLMK_DEVICE float radix_kth_largest(const Src& src, float dom_lo, int64_t k, RowSmem& sm) {
  constexpr int N = Src::N;
  const int tid = threadIdx.x, T = blockDim.x;
  uint32_t prefix = 0, mask = 0;
  int remaining = static_cast<int>(k);
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
    const int nbins = pass == 2 ? 1024 : 2048;
    for (int i = tid; i < nbins; i += T) sm.hist[i] = 0;
    __syncthreads();
    for_each_vec(src, [&](int64_t, const float (&w)[N]) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (w[e] > dom_lo) {
          const uint32_t key = order_key(w[e]);
          if ((key & mask) == prefix) atomicAdd(&sm.hist[(key >> shift) & static_cast<uint32_t>(nbins - 1)], 1);
        }
      }
    });
    __syncthreads();
    // thread t owns the bins nbins-1-t*G down to nbins-(t+1)*G: a scan in descending bin order
    const int G = (nbins + T - 1) / T;
    const int d0 = tid * G, d1 = d0 + G < nbins ? d0 + G : nbins;
    int local = 0;
    for (int d = d0; d < d1; ++d) local += sm.hist[nbins - 1 - d];
    const int incl = block_inclusive_scan(local, sm.ired);
    const int first = simt::block_allreduce(incl >= remaining ? tid : INT_MAX, sm.ired, simt::MinOp(), INT_MAX);
    if (tid == first) {
      int above = incl - local;
      for (int d = d0; d < d1; ++d) {
        const int c = sm.hist[nbins - 1 - d];
        if (above + c >= remaining) {
          sm.digit = nbins - 1 - d;
          sm.remaining = remaining - above;
          break;
        }
        above += c;
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sm.digit) << shift;
    mask |= static_cast<uint32_t>(nbins - 1) << shift;
    remaining = sm.remaining;
  }
  return key_to_float(prefix);
}

// A row of logits loaded as its softmax: the maximum, then the sum of exp((x - max) / T), then
// the statistics of the normalised weights (the same floats softmax_rows writes). Returns the
// weight source; L carries the load results (degenerate / greedy rows need no weights).
// mask: the row's token bitmask (null: none), applied as the row is read in every pass.
template <typename T>
LLMK_DEVICE LogitsSrc<T> load_logits(const T* x, int64_t V, float temp, Loaded& L, RowSmem& sm,
                                     const int32_t* mask = nullptr) {
  const RowMax mx = row_load(ProbsSrc<T>(x, V, mask, -INFINITY), INFINITY, nullptr, sm);
  L.argmax = mx.argmax;
  // 1 / T in double rounds to the correctly rounded fp32 quotient (as on the CPU)
  LogitsSrc<T> w(x, V, mx.max_w, static_cast<float>(1.0 / static_cast<double>(temp)), mask);
  if (logits_row_decided(mx.max_w, temp, L)) return w;
  PivotStats st[1];
  const float zero = 0.0f;
  row_stats<1, false>(w, &zero, st, sm);
  if (degenerate_mass(st[0].mass)) {
    L.degenerate = true;
    return w;
  }
  w.inv_s = static_cast<float>(1.0 / st[0].mass);
  const RowMax mw = row_load(w, 0.0f, st, sm);  // the probability path's load pass, on the same floats
  L = Loaded{st[0].mass, st[0].cnt, st[0].min_gt, mw.max_w, mx.argmax, degenerate_mass(st[0].mass), false};
  return w;
}

// ---- the row interface of row_algo.h ----------------------------------------------------------------

// One CTA's passes over a row whose weights come from Src (recomputed from the input every pass).
template <typename Src>
struct DeviceRow {
  const Src& src;
  RowSmem& sm;

  template <int P, bool WantMin>
  LLMK_DEVICE void stats(const float* piv, PivotStats* out) {
    row_stats<P, WantMin>(src, piv, out, sm);
  }
  LLMK_DEVICE void set_low(int) {}
  LLMK_DEVICE Pick select(float low, double target) { return row_select(src, low, INFINITY, target, sm); }
  LLMK_DEVICE void narrowed(float, int64_t, double&) {}
  // A candidate drawn by mass from the bracket (lo, hi] (a mass quantile of the bracket).
  LLMK_DEVICE float bracket_draw(const Search& S, float u) {
    const Pick pk = row_select(src, S.lo, S.hi, static_cast<double>(u) * (S.mass_lo - S.mass_hi), sm);
    return pk.token >= 0 ? pk.w : NAN;
  }
  LLMK_DEVICE void search_narrowed(Search&, bool) {}
  template <class Acc>
  LLMK_DEVICE void search_fallback(Search&, const Acc&) {}  // not reached: the bracket halves every pass
  // The top-k set by radix selection: the set, and so the sample, is the one the CPU kernels find.
  LLMK_DEVICE Threshold topk_set(int64_t k, const Search& dom, const RowRng*, uint32_t, bool, bool want_mass) {
    const float low = float_below(radix_kth_largest(src, dom.lo, k, sm));
    if (!want_mass) return {low, 0.0, 0};
    PivotStats st[1];
    row_stats<1, false>(src, &low, st, sm);
    return {low, st[0].mass, st[0].cnt};
  }
};

}  // namespace samp
}  // namespace gpu
}  // namespace llmk
