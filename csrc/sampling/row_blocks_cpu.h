// CPU sampling rows, the level below the Row (row_engine_cpu.h): the block size and vector width,
// a row's team, its working set (Span, the team's Shared buffers) and the vectorised loops over one
// 2048-element block (pivot statistics, max/argmax, exp, conversion). Every reduction is per block
// in a fixed lane order, the same bits on every SIMD build. Included only through row_engine_cpu.h,
// by *_cpu.cpp files (one copy per SIMD level).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/aligned_vector.h"
#include "common/exp_cpu.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"
#include "common/tensor.h"
#include "sampling/sampling.h"
#include "sampling/row_algo.h"
#include "sampling/sampling_math.h"

LLMK_NS_BEGIN
namespace rowcpu {

constexpr int64_t kBlock = 2048;  // elements per block: 8 KB of fp32, stays in L1 between two loops
constexpr int kL = 16;            // lanes of the vectorised loops (one AVX-512 register of fp32)
constexpr int kMaxPiv = 4;
constexpr int64_t kSplitRowMinVocab = 1 << 18;  // rows this long are shared by all threads
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Team {
  int tid = 0, nt = 1;
  void sync() const {
    if (nt > 1) team_barrier();
  }
};

// ---- element access: common/vec_cpu.h's convention (Elem<DT>, to_f32<DT>, dispatch_elem) -------

using vec::dispatch_elem;
using vec::elem_t;

// ---- the working set of a row ---------------------------------------------------------------------

// Weights of the row (or of a compacted subset): w[0..n), idx[j] = vocabulary id (null: identity).
struct Span {
  const float* w = nullptr;
  const int32_t* idx = nullptr;
  int64_t n = 0;
  int64_t nblocks() const { return (n + kBlock - 1) / kBlock; }
  int64_t token(int64_t j) const { return idx ? idx[j] : j; }
};

// Buffers shared by the threads of a team (one set per concurrently processed row).
struct Shared {
  aligned_vector<float> w;                  // weights of the current row
  aligned_vector<float> cw[2];              // compacted weights (ping-pong)
  aligned_vector<int32_t> ci[2];            // their vocabulary ids
  std::vector<float> bmass, bmin, bmax;     // per-pivot per-block partials [kMaxPiv][nblocks]
  std::vector<int32_t> bcnt, barg;
  int64_t fast_token = -1;                  // the leader's one-pass top-k result (-1: none)
  int64_t cap = -1;

  void ensure(int64_t V) {
    if (V <= cap) return;
    cap = V;
    const int64_t nb = (V + kBlock - 1) / kBlock;
    w.resize(V);
    for (int i = 0; i < 2; ++i) {
      cw[i].resize(V);
      ci[i].resize(V);
    }
    bmass.resize(kMaxPiv * nb);
    bmin.resize(kMaxPiv * nb);
    bmax.resize(nb);
    bcnt.resize(kMaxPiv * nb);
    barg.resize(nb);
  }
};

inline Shared& thread_shared(int64_t V) {
  static thread_local Shared s;
  s.ensure(V);
  return s;
}

// ---- block loops (the vectorised inner work) -----------------------------------------------------

// 16 lanes (kL) as kNV native vectors: one zmm on AVX-512, two ymm on AVX2, four xmm on the
// scalar build. Lane l lives in part l / VL, position l % VL, so every lane-wise operation and every
// fixed-order reduction below gives the same bits on every build. (GCC's generic 64-byte vector
// types lower to scalar code with stack spills on AVX2: sampling passes ran ~10x slower there.)
constexpr int kNV = kL / vec::VL;
static_assert(kNV * vec::VL == kL, "kL must be a multiple of the native vector width");

struct vi {
  vec::vi p[kNV];
  int32_t operator[](int l) const { return reinterpret_cast<const int32_t*>(p)[l]; }
  int32_t& operator[](int l) { return reinterpret_cast<int32_t*>(p)[l]; }
};
struct vf {
  vec::vf p[kNV];
  float operator[](int l) const { return reinterpret_cast<const float*>(p)[l]; }
};

#define LLMK_ROW_LANEWISE(R, A, B, OP)                         \
  LLMK_ALWAYS_INLINE R operator OP(const A& a, const B& b) {   \
    R r;                                                       \
    for (int k = 0; k < kNV; ++k) r.p[k] = a.p[k] OP b.p[k];  \
    return r;                                                  \
  }
LLMK_ROW_LANEWISE(vf, vf, vf, +)
LLMK_ROW_LANEWISE(vf, vf, vf, *)
LLMK_ROW_LANEWISE(vi, vf, vf, >)
LLMK_ROW_LANEWISE(vi, vf, vf, <)
LLMK_ROW_LANEWISE(vi, vf, vf, !=)
LLMK_ROW_LANEWISE(vi, vi, vi, +)
LLMK_ROW_LANEWISE(vi, vi, vi, -)
LLMK_ROW_LANEWISE(vi, vi, vi, &)
LLMK_ROW_LANEWISE(vi, vi, vi, |)
LLMK_ROW_LANEWISE(vi, vi, vi, !=)
#undef LLMK_ROW_LANEWISE
LLMK_ALWAYS_INLINE vf& operator+=(vf& a, const vf& b) { return a = a + b; }
LLMK_ALWAYS_INLINE vi& operator-=(vi& a, const vi& b) { return a = a - b; }

// Bit reinterpretations (lane for lane).
LLMK_ALWAYS_INLINE vi as_i(const vf& a) {
  vi r;
  for (int k = 0; k < kNV; ++k) r.p[k] = reinterpret_cast<vec::vi>(a.p[k]);
  return r;
}
LLMK_ALWAYS_INLINE vf as_f(const vi& a) {
  vf r;
  for (int k = 0; k < kNV; ++k) r.p[k] = reinterpret_cast<vec::vf>(a.p[k]);
  return r;
}

LLMK_ALWAYS_INLINE vf vload(const float* p) {
  vf v;
  for (int k = 0; k < kNV; ++k) v.p[k] = vec::loadu(p + k * vec::VL);
  return v;
}
template <DType DT>
inline vf vload_conv(const elem_t<DT>* p) {
  vf v;  // each part converted in registers (the conversions are exact: the same floats as to_f32)
  for (int k = 0; k < kNV; ++k) v.p[k] = vec::load<DT>(p + k * vec::VL);
  return v;
}
LLMK_ALWAYS_INLINE vf vsplat(float x) {
  vf v;
  for (int k = 0; k < kNV; ++k) v.p[k] = vec::splat(x);
  return v;
}
LLMK_ALWAYS_INLINE vi vsplat_i(int32_t x) {
  vi v;
  for (int k = 0; k < kNV; ++k) v.p[k] = vec::vi{} + x;
  return v;
}
LLMK_ALWAYS_INLINE vi operator+(const vi& a, int32_t x) { return a + vsplat_i(x); }
LLMK_ALWAYS_INLINE vi vseli(const vi& m, const vi& a, const vi& b) {
  vi r;
  for (int k = 0; k < kNV; ++k) r.p[k] = (m.p[k] & a.p[k]) | (~m.p[k] & b.p[k]);
  return r;
}
LLMK_ALWAYS_INLINE vf vsel(const vi& m, const vf& a, const vf& b) { return as_f(vseli(m, as_i(a), as_i(b))); }
LLMK_ALWAYS_INLINE vf vmask(const vi& m, const vf& x) { return as_f(m & as_i(x)); }  // x where m, else +0
// a where a < b, else b (one vminps per part): b keeps ties and NaN a.
LLMK_ALWAYS_INLINE vf vmin_keep(const vf& a, const vf& b) {
  vf r;
  for (int k = 0; k < kNV; ++k) r.p[k] = a.p[k] < b.p[k] ? a.p[k] : b.p[k];
  return r;
}

// Fixed-order lane reductions (the same tree on every build).
inline float hsum(const vf& v) {
  float a[kL];
  __builtin_memcpy(a, &v, sizeof(a));
  for (int h = kL / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) a[l] += a[l + h];
  return a[0];
}
inline int32_t hsum_i(const vi& v) {
  int32_t a[kL];
  __builtin_memcpy(a, &v, sizeof(a));
  int32_t s = 0;
  for (int l = 0; l < kL; ++l) s += a[l];
  return s;
}
inline float hmin(const vf& v) {
  float a[kL];
  __builtin_memcpy(a, &v, sizeof(a));
  float m = a[0];
  for (int l = 1; l < kL; ++l) m = a[l] < m ? a[l] : m;
  return m;
}

// Per pivot: sum, count and (WantMin; else +inf) minimum of the elements strictly above it, over
// w[lo, hi).
template <int P, bool WantMin = true>
inline void block_stats(const float* w, int64_t lo, int64_t hi, const float* piv, float* mass,
                        int32_t* cnt, float* mn) {
  vf m[P], mi[P], pv[P];
  vi c[P];
  for (int p = 0; p < P; ++p) {
    m[p] = vsplat(0.0f);
    mi[p] = vsplat(kInf);
    c[p] = vsplat_i(0);
    pv[p] = vsplat(piv[p]);
  }
  const vf inf = vsplat(kInf);
  const auto add = [&](const vf& x) __attribute__((always_inline)) {  // one group of kL values
    for (int p = 0; p < P; ++p) {
      const vi g = x > pv[p];
      m[p] += vmask(g, x);
      c[p] -= g;
      // min over {x > pivot}: the others enter as +inf, never below. The running minimum's chain
      // is one vminps (a select of (g and x < min) was four dependent ops, half the pass's time).
      if constexpr (WantMin) mi[p] = vmin_keep(vsel(g, x, inf), mi[p]);
    }
  };
  int64_t j = lo;
  for (; j + kL <= hi; j += kL) add(vload(w + j));
  if (j < hi) {  // tail: pad with -inf (never above a pivot)
    float tmp[kL];
    for (int l = 0; l < kL; ++l) tmp[l] = j + l < hi ? w[j + l] : -kInf;
    add(vload(tmp));
  }
  for (int p = 0; p < P; ++p) {
    mass[p] = hsum(m[p]);
    cnt[p] = hsum_i(c[p]);
    mn[p] = hmin(mi[p]);
  }
}

// Load-pass partials of block b: mass, count and minimum of the weights of w[lo, hi) above dom_lo
// (positive weights: dom_lo = 0), stored as pivot 0 of the shared per-block buffers.
inline void store_stats_above(Shared& s, const float* w, int64_t lo, int64_t hi, int64_t b, float dom_lo) {
  float mass, mn;
  int32_t cnt;
  block_stats<1>(w, lo, hi, &dom_lo, &mass, &cnt, &mn);
  s.bmass[b] = mass;
  s.bcnt[b] = cnt;
  s.bmin[b] = mn;
}
inline void store_positive_stats(Shared& s, const float* w, int64_t lo, int64_t hi, int64_t b) {
  store_stats_above(s, w, lo, hi, b, 0.0f);
}
// Maximum (NaN ignored) and the first index reaching it, over x[lo, hi) converted to fp32.
template <DType DT>
inline void block_max_arg(const elem_t<DT>* x, int64_t lo, int64_t hi, float& mx, int32_t& arg) {
  vf lm = vsplat(-kInf);
  vi li = vsplat_i(-1);
  vi iota;
  for (int l = 0; l < kL; ++l) iota[l] = l;
  int64_t j = lo;
  for (; j + kL <= hi; j += kL) {
    const vf v = vload_conv<DT>(x + j);
    const vi gt = v > lm;  // strict: the first index of a lane's maximum is kept
    lm = vsel(gt, v, lm);
    li = vseli(gt, iota + static_cast<int32_t>(j), li);
  }
  float best = -kInf;
  int64_t a = -1;
  for (int l = 0; l < kL; ++l)
    if (li[l] >= 0 && (lm[l] > best || (lm[l] == best && li[l] < a))) {
      best = lm[l];
      a = li[l];
    }
  for (; j < hi; ++j) {
    const float v = vec::to_f32<DT>(x[j]);
    if (v > best || (a < 0 && v == best)) {
      best = v;
      a = j;
    }
  }
  mx = a < 0 ? -kInf : best;
  arg = static_cast<int32_t>(a < 0 ? lo : a);
}

// Maximum of x[lo, hi) converted to fp32, NaN ignored (-inf when nothing else): max(x, acc) keeps
// acc when x is NaN. Four accumulators (the order does not matter to a maximum).
template <DType DT>
inline float block_max(const elem_t<DT>* x, int64_t lo, int64_t hi) {
  vec::vf acc[4];
  for (auto& a : acc) a = vec::splat(-kInf);
  int64_t j = lo;
  for (; j + 4 * vec::VL <= hi; j += 4 * vec::VL)
    for (int u = 0; u < 4; ++u) acc[u] = vec::vmax(vec::load<DT>(x + j + u * vec::VL), acc[u]);
  // one vector, then its lanes: no lane is NaN, and which of +0 and -0 wins changes no weight
  float m = vec::hmax(vec::vmax(vec::vmax(acc[0], acc[1]), vec::vmax(acc[2], acc[3])));
  for (; j < hi; ++j) {
    const float v = vec::to_f32<DT>(x[j]);
    m = v > m ? v : m;
  }
  return m;
}

// The first index of x[lo, hi) whose value is m, among the positions a packed bitmask allows
// when there is one (lo when there is none).
template <DType DT>
inline int64_t block_find(const elem_t<DT>* x, int64_t lo, int64_t hi, float m, const int32_t* mask = nullptr) {
  for (int64_t j = lo; j < hi; ++j)
    if (vec::to_f32<DT>(x[j]) == m && (!mask || token_allowed(mask, j))) return j;
  return lo;
}

// Sum of w[lo, hi) in a fixed order (the same bits on every build): 16-lane groups into four
// accumulators by group index mod 4 (independent add chains), then combined and reduced. With
// `acc_in`: the sums of the groups before `from` (lo plus a multiple of four groups), taken as
// they were computed.
inline float block_sum(const float* w, int64_t lo, int64_t hi, const vf* acc_in = nullptr, int64_t from = 0) {
  vf acc[4];
  for (int g = 0; g < 4; ++g) acc[g] = acc_in ? acc_in[g] : vsplat(0.0f);
  int64_t j = acc_in ? from : lo;
  for (; j + 4 * kL <= hi; j += 4 * kL)
    for (int g = 0; g < 4; ++g) acc[g] += vload(w + j + g * kL);
  for (int g = 0; j < hi; j += kL, ++g) {
    float tmp[kL];
    for (int l = 0; l < kL; ++l) tmp[l] = j + l < hi ? w[j + l] : 0.0f;
    acc[g] += vload(tmp);
  }
  return hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// w = exp((x - m) * inv_t) (NaN -> 0) over [lo, hi), returning block_sum(w, lo, hi): its whole
// groups of four are summed as they are computed (a second loop over the block cost ~10% of the
// pass). `ahead` (0: none): bytes the thread reads next, prefetched line by line at the pace of the
// loop (without it the next block's first read waited on memory with nothing else in flight: plain
// sampling from memory was 26-35% slower).
template <DType DT>
inline float block_exp_sum(const elem_t<DT>* x, int64_t lo, int64_t hi, float m, float inv_t, float* w,
                           uintptr_t ahead = 0) {
  // Native vectors explicitly: GCC leaves the element loop scalar (exp_nonpos per element).
  const vec::vf vm = vec::splat(m), vt = vec::splat(inv_t * kLog2e);
  vf acc[4];
  for (auto& a : acc) a = vsplat(0.0f);
  // where block_sum's groups of four end: a multiple of four native vectors on every build
  const int64_t whole = lo + (hi - lo) / (4 * kL) * (4 * kL);
  int64_t j = lo;
  // U vectors from j, their exp chains interleaved (four per step, then one at a time).
  const auto step = [&](auto U) __attribute__((always_inline)) {
    constexpr int kU = decltype(U)::value;
    if constexpr (kU > 1) {
      constexpr int kBytes = kU * vec::VL * static_cast<int>(sizeof(elem_t<DT>));
      if (ahead) vec::prefetch_row(reinterpret_cast<const void*>(ahead + (j - lo) * sizeof(elem_t<DT>)), kBytes);
    }
    vec::vf v[kU], a[kU], e[kU];
    for (int u = 0; u < kU; ++u) {
      v[u] = vec::load<DT>(x + j + u * vec::VL);
      a[u] = (v[u] - vm) * vt;
    }
    exp2_nonpos_n<kU>(a, e);
    for (int u = 0; u < kU; ++u) vec::storeu(w + j + u * vec::VL, e[u]);  // NaN logits: a is NaN, e 0
    if constexpr (kU == 4) {
      if (j < whole) {  // native vector q of the block is part q % kNV of group q / kNV
        const int64_t q0 = (j - lo) / vec::VL;
        for (int u = 0; u < kU; ++u) acc[(q0 + u) / kNV % 4].p[(q0 + u) % kNV] += e[u];
      }
    }
    j += kU * vec::VL;
  };
  while (j + 4 * vec::VL <= hi) step(std::integral_constant<int, 4>{});
  while (j + vec::VL <= hi) step(std::integral_constant<int, 1>{});
  for (; j < hi; ++j) {
    const float v = vec::to_f32<DT>(x[j]);
    float e;
    const float a = (v - m) * (inv_t * kLog2e);
    exp2_nonpos_n<1>(&a, &e);
    w[j] = e;
  }
  return block_sum(w, lo, hi, acc, whole);
}

// out[lo, hi) = e[lo, hi) * c (out may be e).
inline void block_scale(const float* e, int64_t lo, int64_t hi, float c, float* out) {
  const vec::vf vc = vec::splat(c);
  int64_t j = lo;
  for (; j + vec::VL <= hi; j += vec::VL) vec::storeu(out + j, vec::loadu(e + j) * vc);
  for (; j < hi; ++j) out[j] = e[j] * c;
}

// block_scale, returning the sum of the products in block_stats' order (one 16-lane accumulator):
// for weights >= +0 that is block_stats' mass above 0, bit for bit, at a fraction of its work.
inline float block_scale_mass(const float* e, int64_t lo, int64_t hi, float c, float* out) {
  const vf vc = vsplat(c);
  vf acc = vsplat(0.0f);
  int64_t j = lo;
  for (; j + kL <= hi; j += kL) {
    const vf y = vload(e + j) * vc;
    for (int k = 0; k < kNV; ++k) vec::storeu(out + j + k * vec::VL, y.p[k]);
    acc += y;
  }
  if (j < hi) {
    float tmp[kL];
    for (int l = 0; l < kL; ++l) tmp[l] = j + l < hi ? (out[j + l] = e[j + l] * c) : 0.0f;
    acc += vload(tmp);
  }
  return hsum(acc);
}

template <DType DT>
inline void block_convert(const elem_t<DT>* x, int64_t lo, int64_t hi, float* w) {
  for (int64_t j = lo; j < hi; ++j) w[j] = vec::to_f32<DT>(x[j]);
}

// w = x in fp32, with `fill` at the positions the packed bitmask disallows (lo: a multiple of 32).
template <DType DT>
inline void block_masked(const elem_t<DT>* x, int64_t lo, int64_t hi, const int32_t* mask, float fill, float* w) {
  for (int64_t j0 = lo; j0 < hi; j0 += 32) {
    const uint32_t bits = static_cast<uint32_t>(mask[j0 >> 5]);
    const int64_t e = std::min(hi, j0 + 32);
    for (int64_t j = j0; j < e; ++j) w[j] = (bits >> (j - j0)) & 1u ? vec::to_f32<DT>(x[j]) : fill;
  }
}

// Sum of w > low over a 16-element chunk.
inline float chunk_mass(const float* w, float low) {
  const vf x = vload(w);
  return hsum(vmask(x > vsplat(low), x));
}

}  // namespace rowcpu
LLMK_NS_END
