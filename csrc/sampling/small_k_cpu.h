// CPU fast path of top-k sampling for small k (top_k_first order): one pass over the row keeps a
// short candidate list under a rising threshold, and everything else (exact top-k set, top-p on
// it, the draw) works on those few candidates. The pivot searches of sampling_cpu.cpp need several
// passes over the whole row; here the row is read once.
//
// The kept set is exactly the one of the general rule in sampling_math.h (ties at the k-th weight
// all kept): for logits the threshold is held in logit space, T / 1024 below the k-th largest
// logit. Two logits that far apart have exponents (x - max) / T at least ~1e-3 apart after
// rounding (|exponent| <= 87 where the weight is non-zero), and exp_nonpos is accurate to ~1e-6,
// so their weights keep their order: every token whose weight reaches the k-th weight stays a
// candidate.
// The draw then replays the general path's rounds on the top-k set (see draw_small_k), so both
// paths, and the CUDA kernels, give the same token for the same seed. Included by
// sampling_cpu.cpp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace rowcpu {

constexpr int64_t kSmallK = 1024;  // largest k taking the one-pass path

// Bit l set when lane l of x is > lo (NaN never). Only the control flow depends on the ISA:
// the candidate set is the same on every build.
inline uint32_t gt_mask(const vf& x, float lo) {
  uint32_t m = 0;
  for (int k = 0; k < kNV; ++k) {
#if defined(__AVX512F__)
    const uint32_t part = _mm512_cmp_ps_mask(x.p[k], _mm512_set1_ps(lo), _CMP_GT_OQ);
#elif defined(__AVX2__)
    const uint32_t part = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x.p[k], _mm256_set1_ps(lo), _CMP_GT_OQ)));
#else
    uint32_t part = 0;
    for (int l = 0; l < vec::VL; ++l) part |= (x.p[k][l] > lo ? 1u : 0u) << l;
#endif
    m |= part << (k * vec::VL);
  }
  return m;
}
// Lane maximum ignoring NaN on either side (a NaN lane must not hide a number from the mask test).
inline vf vmax(const vf& a, const vf& b) { return vsel((b > a) | (a != a), b, a); }

struct Cand {
  float key;  // logit (logits rows) or weight (probability rows)
  int32_t id;
  float w;    // weight, filled after the pass
};

// Per-thread candidate storage.
struct CandBuf {
  std::vector<Cand> c;
  std::vector<float> tmp;
};
inline CandBuf& thread_cands() {
  static thread_local CandBuf b;
  return b;
}

// The k-th largest of field(c) over the candidates (1 <= k <= their number).
template <typename Field>
inline float kth_largest(CandBuf& b, int64_t k, Field field) {
  b.tmp.resize(b.c.size());
  for (size_t i = 0; i < b.c.size(); ++i) b.tmp[i] = field(b.c[i]);
  std::nth_element(b.tmp.begin(), b.tmp.begin() + (k - 1), b.tmp.end(), std::greater<float>());
  return b.tmp[k - 1];
}

// Drops the candidates more than `margin` below the k-th largest key (ties with it kept) and
// returns the new threshold (never below lo): the list then holds the keys > threshold.
inline float shrink_candidates(CandBuf& b, int64_t k, float margin, float lo) {
  std::vector<Cand>& c = b.c;
  const float kth = kth_largest(b, k, [](const Cand& e) { return e.key; });
  const float nlo = std::min(float_below(kth), kth - margin);  // strictly below kth: ties kept
  if (!(nlo > lo)) return lo;
  c.erase(std::remove_if(c.begin(), c.end(), [nlo](const Cand& e) { return !(e.key > nlo); }), c.end());
  return nlo;
}

// Lanes of x[j, j + 16) as fp32, -inf where the token bitmask (Masked) disallows the token.
template <DType DT, bool Masked>
inline vf vload_allowed(const elem_t<DT>* x, int64_t j, const int32_t* mask) {
  const vf v = vload_conv<DT>(x + j);
  if constexpr (!Masked) {
    return v;
  } else {
    const int32_t bits = static_cast<int32_t>((static_cast<uint32_t>(mask[j >> 5]) >> (j & 31)) & 0xffffu);
    vi lane;
    for (int l = 0; l < kL; ++l) lane[l] = 1 << l;
    return vsel((vsplat_i(bits) & lane) != vsplat_i(0), v, vsplat(-kInf));
  }
}

// The pass: collects every element with key > lo into `cand`, raising lo to (k-th largest key
// minus margin) whenever the list fills. Returns false when the list cannot stay short (a margin
// so wide that most of the row is within it): the caller then takes the general path. Masked:
// tokens the bitmask disallows read -inf (never candidates), in the same pass.
template <DType DT, bool Masked>
bool collect_candidates(const elem_t<DT>* x, int64_t V, int64_t k, float margin, float init_lo, CandBuf& b,
                        float& row_max, const int32_t* mask) {
  std::vector<Cand>& c = b.c;
  c.clear();
  int64_t cap = std::max<int64_t>(4 * k, 256);
  const int64_t give_up = std::max<int64_t>(cap, V / 8);
  float lo = init_lo;
  vf m = vsplat(-kInf);
  auto shrink = [&]() {
    lo = shrink_candidates(b, k, margin, lo);
    while (static_cast<int64_t>(c.size()) * 2 > cap) cap *= 2;
    return cap <= give_up;
  };
  auto push_lanes = [&](const vf& v, int64_t j0) {
    for (uint32_t msk = gt_mask(v, lo); msk; msk &= msk - 1) {
      const int l = __builtin_ctz(msk);
      c.push_back(Cand{v[l], static_cast<int32_t>(j0 + l), 0.0f});
    }
  };
  constexpr int64_t kStep = 4 * kL;
  int64_t j = 0;
  for (; j + kStep <= V; j += kStep) {
    const vf v0 = vload_allowed<DT, Masked>(x, j, mask), v1 = vload_allowed<DT, Masked>(x, j + kL, mask);
    const vf v2 = vload_allowed<DT, Masked>(x, j + 2 * kL, mask), v3 = vload_allowed<DT, Masked>(x, j + 3 * kL, mask);
    const vf a = vmax(vmax(v0, v1), vmax(v2, v3));
    m = vmax(m, a);
    if (!gt_mask(a, lo)) continue;
    push_lanes(v0, j);
    push_lanes(v1, j + kL);
    push_lanes(v2, j + 2 * kL);
    push_lanes(v3, j + 3 * kL);
    if (static_cast<int64_t>(c.size()) >= cap && !shrink()) return false;
  }
  float mx = -kInf;
  for (int l = 0; l < kL; ++l) mx = m[l] > mx ? m[l] : mx;
  for (; j < V; ++j) {
    const float v = !Masked || token_allowed(mask, j) ? vec::to_f32<DT>(x[j]) : -kInf;
    mx = v > mx ? v : mx;
    if (v > lo) c.push_back(Cand{v, static_cast<int32_t>(j), 0.0f});
  }
  row_max = mx;
  return true;
}

// Inverse CDF over the candidates with w > low, in vocabulary order: the first whose running
// mass exceeds target (the last one above low when rounding leaves the target uncrossed).
inline int64_t select_in(const std::vector<Cand>& c, float low, double target) {
  double acc = 0.0;
  int64_t last = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!(c[i].w > low)) continue;
    last = static_cast<int64_t>(i);
    acc += c[i].w;
    if (acc > target) break;
  }
  return last;
}

// The candidates of the top-k set as a row of row_algo.h (weights in vocabulary order): passes are
// plain loops over the few candidates, sums in double in vocabulary order.
struct CandRow {
  const std::vector<Cand>& c;

  template <int P, bool WantMin>
  void stats(const float* piv, PivotStats* out) const {
    for (int p = 0; p < P; ++p) {
      PivotStats st;
      for (const Cand& e : c)
        if (e.w > piv[p]) {
          st.mass += e.w;
          ++st.cnt;
          st.min_gt = std::min(st.min_gt, e.w);
        }
      out[p] = st;
    }
  }
  void set_low(int) const {}
  Pick select(float low, double target) const {
    const int64_t i = select_in(c, low, target);
    return i < 0 ? Pick{-1, 0.0f} : Pick{c[i].id, c[i].w};
  }
  void narrowed(float, int64_t, double&) const {}
  float bracket_draw(const Search& S, float u) const {
    const Pick pk = select(S.lo, static_cast<double>(u) * (S.mass_lo - S.mass_hi));
    return pk.token >= 0 ? pk.w : NAN;
  }
  void search_narrowed(Search&, bool) const {}
  template <class Acc>
  void search_fallback(Search&, const Acc&) const {}  // not reached: the bracket halves every pass
  Threshold topk_set(int64_t k, const Search& dom, const RowRng* rng, uint32_t base, bool, bool) {
    Search S = dom;
    exact_search(*this, S, TopKAcc{k}, rng, base, false);
    return {S.lo, S.mass_lo, S.cnt_lo};
  }
};

// The exact top-k set K (ties kept), then the draw of the general path restricted to K: it keeps
// K first and then only ever looks at weights inside K (every pivot is at least the drawn
// candidate's weight), so running row_algo.h's draw on K gives the same token for the same stream.
// Candidates have their weights set; max_w is the row's largest weight. -1: no positive weight.
inline int64_t draw_small_k(CandBuf& b, int64_t k, float top_p, float max_w, const RowRng& rng) {
  std::vector<Cand>& c = b.c;
  c.erase(std::remove_if(c.begin(), c.end(), [](const Cand& e) { return !(e.w > 0.0f); }), c.end());
  if (c.empty()) return -1;
  if (static_cast<int64_t>(c.size()) > k) {  // keep w >= the k-th weight
    const float kth = kth_largest(b, k, [](const Cand& e) { return e.w; });
    c.erase(std::remove_if(c.begin(), c.end(), [kth](const Cand& e) { return e.w < kth; }), c.end());
  }
  std::sort(c.begin(), c.end(), [](const Cand& x, const Cand& y) { return x.id < y.id; });
  Loaded L;
  for (const Cand& e : c) {
    L.mass += e.w;
    L.min_pos = std::min(L.min_pos, e.w);
  }
  L.cnt = static_cast<int64_t>(c.size());
  L.max_w = max_w;
  CandRow row{c};
  const RowResult res = sample_loaded(row, L, RowFilter{0, top_p, 0.0f, true}, rng);
  return res.valid ? res.token : -1;
}

// One row of top-k (+ top-p, top_k_first) sampling from logits (temperature > 0) or
// probabilities, under the row's token bitmask when `mask` is set. Returns false when the row
// needs the general path (non-finite maximum, a list that cannot stay short, no positive weight,
// infinite mass).
template <DType DT>
bool sample_small_k(const elem_t<DT>* x, int64_t V, bool is_logits, float temperature, int64_t k, float top_p,
                    const RowRng& rng, int64_t& token, const int32_t* mask = nullptr) {
  CandBuf& b = thread_cands();
  float mx;
  const float margin = is_logits ? temperature * (1.0f / 1024.0f) : 0.0f;
  const float init_lo = is_logits ? -kInf : 0.0f;
  const bool ok = mask ? collect_candidates<DT, true>(x, V, k, margin, init_lo, b, mx, mask)
                       : collect_candidates<DT, false>(x, V, k, margin, init_lo, b, mx, nullptr);
  if (!ok) return false;
  if (!std::isfinite(mx)) return false;
  if (static_cast<int64_t>(b.c.size()) > 2 * k) shrink_candidates(b, k, margin, init_lo);
  const float inv_t = 1.0f / temperature;
  for (Cand& e : b.c) {
    // the general path's weight up to its normalisation (load_logits / load_probs): draws inside
    // the top-k set do not depend on the scale (scale-free pivots), up to rounding
    e.w = is_logits ? exp_nonpos((e.key - mx) * inv_t) : e.key;
    if (!std::isfinite(e.w)) return false;
  }
  const float max_w = is_logits ? 1.0f : mx;  // exp(0) at the maximum logit
  const int64_t t = draw_small_k(b, k, top_p, max_w, rng);
  if (t < 0) return false;
  token = t;
  return true;
}

}  // namespace rowcpu
LLMK_NS_END
