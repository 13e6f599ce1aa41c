// CPU attention tile kernels (one build per SIMD level). Both take a Task (query rows of one
// sequence sharing a kv head, one key range) and leave in the thread's Scratch the un-normalised
// fp32 output O[r][d] and the softmax state (m, l) of every row, after an online softmax over
// key tiles of kBK keys.
//
// attend_gemm (prefill, many rows): K and V tiles are converted once to fp32 [kBK][dp], Q once
// per task to Q^T [D][Mp] (scaled). S^T = K.Q^T is a register-blocked GEMM with the rows in the
// vector lanes, which makes the softmax (max / exp / sum over keys) purely lane-wise; O += P.V is
// a second register-blocked GEMM broadcasting P.
//
// attend_small (decode and short appends, few rows): K/V rows are read straight from the cache
// and converted in registers; every load serves all rows of the group. Dot products are reduced
// VL keys at a time by a transposing tree.
#include <string.h>

#include <algorithm>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"

LLMK_NS_BEGIN
namespace attn {
namespace {

constexpr int kBK = 64;  // keys per tile (a multiple of every VL)
constexpr int kMR = 6;   // keys per Q.K^T micro-tile, rows per P.V micro-tile
#if defined(__AVX512F__)
constexpr int kNR = 4;   // vectors per micro-tile: 6 x 4 accumulators of 32 registers
#else
constexpr int kNR = 2;   // 6 x 2 of 16 registers
#endif

LLMK_ALWAYS_INLINE int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <DType T>
using E = typename Elem<T>::type;

template <DType T>
LLMK_ALWAYS_INLINE const E<T>* q_row(const AttnParams& p, int b, int i, int h) {
  return static_cast<const E<T>*>(p.q) + int64_t(attn_q_start(p, b) + i) * p.q_row_stride +
         int64_t(h) * p.q_head_stride;
}

template <DType T>
LLMK_ALWAYS_INLINE const E<T>* kv_row(const AttnParams& p, bool is_v, int b, int j, int h) {
  return static_cast<const E<T>*>(is_v ? p.v : p.k) + attn_kv_offset(p, is_v, b, j, h);
}

// dst[0..dp) = src[0..d) * scale, zero padded (dp = d rounded up to VL).
template <DType T>
LLMK_ALWAYS_INLINE void row_to_f32(const E<T>* src, int d, float scale, float* dst) {
  int c = 0;
  for (; c + VL <= d; c += VL) storeu(dst + c, load<T>(src + c) * scale);
  if (c < d) storeu(dst + c, load_tail<T>(src + c, d - c) * scale);
}

// Per-row mask / bias data of a task. Rows r = g * nq + qi: query i = i0 + qi, head kvh*G + g.
struct Rows {
  float* lo;     // first visible key
  float* hi;     // one past the last visible key
  float* pos;    // i + sk - sq (ALiBi)
  float* slope;  // ALiBi slope of the row's head (0 without ALiBi)
  int klo, khi;            // union of the rows' key ranges within the task's split
  int full_lo, full_hi;    // keys in [full_lo, full_hi) are visible to every row
};

Rows make_rows(const AttnParams& p, const Task& t, int G, int Mp, float* aux) {
  Rows R{aux, aux + Mp, aux + 2 * Mp, aux + 3 * Mp, 0, 0, 0, 0};
  const int M = t.nh * G * t.nq;
  for (int r = 0; r < Mp; ++r) {
    if (r >= M) {  // vector padding: never visible
      R.lo[r] = 1e30f, R.hi[r] = -1e30f, R.pos[r] = 0.f, R.slope[r] = 0.f;
      continue;
    }
    const int g = r / t.nq, i = t.i0 + r % t.nq;
    const KeyRange kr = attn_key_range(i, t.sq, t.sk, p.window_left, p.window_right);
    R.lo[r] = float(std::max(kr.lo, t.k0));
    R.hi[r] = float(std::min(kr.hi, t.k1));
    R.pos[r] = float(i + t.sk - t.sq);
    R.slope[r] = p.alibi_slopes ? p.alibi_slopes[t.b * p.alibi_batch_stride + t.kvh * G + g] : 0.f;
  }
  // Key ranges move monotonically with i: the first and last query bound the union.
  const KeyRange first = attn_key_range(t.i0, t.sq, t.sk, p.window_left, p.window_right);
  const KeyRange last = attn_key_range(t.i0 + t.nq - 1, t.sq, t.sk, p.window_left, p.window_right);
  R.klo = std::max(first.lo, t.k0);
  R.khi = std::min(last.hi, t.k1);
  R.full_lo = last.lo;
  R.full_hi = first.hi;
  return R;
}

// ---- GEMM micro-kernels -----------------------------------------------------------------------

// s[k][v*VL..] = sum_d kf[k][d] * qt[d][v*VL..] for MK keys x NV row vectors.
template <int MK, int NV>
void qk_micro(const float* __restrict qt, int ldq, const float* __restrict kf, int ldk, int D,
              float* __restrict s, int lds) {
  vf acc[MK][NV];
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) acc[k][v] = splat(0.f);
  for (int d = 0; d < D; ++d) {
    vf q[NV];
    for (int v = 0; v < NV; ++v) q[v] = loadu(qt + int64_t(d) * ldq + v * VL);
    for (int k = 0; k < MK; ++k) {
      const vf kb = splat(kf[k * ldk + d]);
      for (int v = 0; v < NV; ++v) acc[k][v] += kb * q[v];
    }
  }
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) storeu(s + k * lds + v * VL, acc[k][v]);
}

// o[r][v*VL..] = alpha[r] * o[r][..] + sum_j pt[j][r] * vf[j][v*VL..] for MR rows x NV vectors.
template <int MR, int NV>
void pv_micro(float* __restrict o, int ldo, const float* __restrict alpha,
              const float* __restrict pt, int ldp, const float* __restrict vf_, int ldv, int nk) {
  vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = loadu(o + r * ldo + v * VL) * alpha[r];
  for (int j = 0; j < nk; ++j) {
    vf x[NV];
    for (int v = 0; v < NV; ++v) x[v] = loadu(vf_ + j * ldv + v * VL);
    for (int r = 0; r < MR; ++r) {
      const vf pb = splat(pt[j * ldp + r]);
      for (int v = 0; v < NV; ++v) acc[r][v] += pb * x[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) storeu(o + r * ldo + v * VL, acc[r][v]);
}

template <int MK, int NV>
struct QK {
  template <typename... A>
  static void call(A... a) { qk_micro<MK, NV>(a...); }
};
template <int MR, int NV>
struct PV {
  template <typename... A>
  static void call(A... a) { pv_micro<MR, NV>(a...); }
};

// Runtime (mk, nv) -> the template instance F<mk, nv>.
template <template <int, int> class F, int MK, int NV>
struct Pick {
  template <typename... A>
  static LLMK_ALWAYS_INLINE void run(int mk, int nv, A... a) {
    if (mk == MK && nv == NV) {
      F<MK, NV>::call(a...);
    } else if constexpr (NV > 1) {
      Pick<F, MK, NV - 1>::run(mk, nv, a...);
    } else if constexpr (MK > 1) {
      Pick<F, MK - 1, kNR>::run(mk, nv, a...);
    }
  }
};

template <DType T>
void gemm_impl(const AttnParams& p, const Task& t, Scratch& sc) {
  const int D = p.head_dim, dp = round_up(D, VL), G = p.num_heads / p.num_kv_heads;
  const int M = G * t.nq, Mp = round_up(M, VL), nrv = Mp / VL;
  sc.dp = dp;
  float* O = sc.o.get(size_t(M) * dp);
  float* m = sc.m.get(Mp);
  float* l = sc.l.get(Mp);
  float* Qt = sc.q.get(size_t(D) * Mp);
  float* S = sc.s.get(size_t(kBK) * Mp);
  float* Kf = sc.k.get(size_t(kBK) * dp);
  float* Vf = sc.v.get(size_t(kBK) * dp);
  float* alpha = sc.t.get(Mp);
  const Rows R = make_rows(p, t, G, Mp, sc.aux.get(4 * size_t(Mp)));

  memset(O, 0, sizeof(float) * M * dp);
  for (int r = 0; r < Mp; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (R.klo >= R.khi) return;

  // Q^T, pre-scaled by softmax_scale; padding lanes zero.
  if (Mp != M) memset(Qt, 0, sizeof(float) * D * Mp);
  for (int r = 0; r < M; ++r) {
    const E<T>* src = q_row<T>(p, t.b, t.i0 + r % t.nq, t.kvh * G + r / t.nq);
    for (int d = 0; d < D; ++d) Qt[int64_t(d) * Mp + r] = to_f32<T>(src[d]) * p.softmax_scale;
  }

  const float cap = p.softcap, inv_cap = cap > 0.f ? 1.f / cap : 0.f;
  const bool alibi = p.alibi_slopes != nullptr;
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK) {
    const int nk = std::min(kBK, R.khi - j0);
    for (int jj = 0; jj < nk; ++jj) {
      row_to_f32<T>(kv_row<T>(p, false, t.b, j0 + jj, t.kvh), D, 1.f, Kf + jj * dp);
      row_to_f32<T>(kv_row<T>(p, true, t.b, j0 + jj, t.kvh), D, 1.f, Vf + jj * dp);
    }
    // S^T[jj][r] = k_j . q_r
    for (int rv = 0; rv < Mp; rv += kNR * VL) {
      const int nv = std::min(kNR, (Mp - rv) / VL);
      for (int jj = 0; jj < nk; jj += kMR)
        Pick<QK, kMR, kNR>::run(std::min(kMR, nk - jj), nv, Qt + rv, Mp, Kf + jj * dp, dp, D,
                                S + jj * Mp + rv, Mp);
    }
    // Score transforms, masks and the online softmax, lane-wise over rows.
    const bool full = j0 >= R.full_lo && j0 + nk <= R.full_hi;
    for (int v = 0; v < nrv; ++v) {
      const int o = v * VL;
      const vf lo = loadu(R.lo + o), hi = loadu(R.hi + o), pos = loadu(R.pos + o);
      const vf slope = loadu(R.slope + o);
      vf mt = splat(-INFINITY);
      for (int jj = 0; jj < nk; ++jj) {
        float* sp = S + jj * Mp + o;
        vf s = loadu(sp);
        if (cap > 0.f) s = cap * vtanh(s * inv_cap);
        const vf jf = splat(float(j0 + jj));
        if (alibi) {
          const vf dist = pos - jf;
          s -= slope * (dist < 0.f ? -dist : dist);
        }
        if (!full) s = ((jf >= lo) & (jf < hi)) ? s : splat(-INFINITY);
        storeu(sp, s);
        mt = vmax(mt, s);
      }
      const vf mo = loadu(m + o);
      const vf mn = vmax(mo, mt);
      const vf base = mn == splat(-INFINITY) ? splat(0.f) : mn;
      const vf a = vexp(mo - base);
      vf sum = splat(0.f);
      for (int jj = 0; jj < nk; ++jj) {
        float* sp = S + jj * Mp + o;
        const vf e = vexp(loadu(sp) - base);
        storeu(sp, e);
        sum += e;
      }
      storeu(l + o, loadu(l + o) * a + sum);
      storeu(m + o, mn);
      storeu(alpha + o, a);
    }
    // O = alpha * O + P.V
    for (int r0 = 0; r0 < M; r0 += kMR) {
      const int mr = std::min(kMR, M - r0);
      for (int d0 = 0; d0 < dp; d0 += kNR * VL) {
        const int nv = std::min(kNR, (dp - d0) / VL);
        Pick<PV, kMR, kNR>::run(mr, nv, O + int64_t(r0) * dp + d0, dp, alpha + r0, S + r0, Mp,
                                Vf + d0, dp, nk);
      }
    }
  }
}

// ---- decode kernel ----------------------------------------------------------------------------

// Rows r0 .. r0+RR-1 against one key tile (nk keys whose K/V rows are kr[] / vr[]).
// kn / vn (may be null): rows of the next tile, prefetched while this one is computed.
template <DType T, int RR>
void small_chunk(const float* __restrict qs, int dp, int D, const E<T>* const* kr,
                 const E<T>* const* vr, int j0, int nk, const Rows& R, int r0, float cap,
                 bool alibi, float* S, float* O, float* m, float* l, const E<T>* const* kn,
                 const E<T>* const* vn, int nn) {
  const int dfull = D / VL * VL;
  const int row_bytes = D * int(sizeof(E<T>));
  // S[r][jj] = q_r . k_j, VL keys at a time, reduced together.
  for (int jb = 0; jb < nk; jb += VL) {
    const int nb = std::min(VL, nk - jb);
    vf tt[RR][VL];
    for (int k = 0; k < nb; ++k) {
      const E<T>* krow = kr[jb + k];
      if (jb + k < nn) prefetch_row(kn[jb + k], row_bytes);
      vf acc[RR];
      for (int r = 0; r < RR; ++r) acc[r] = splat(0.f);
      int c = 0;
      for (; c < dfull; c += VL) {
        const vf x = load<T>(krow + c);
        for (int r = 0; r < RR; ++r) acc[r] += loadu(qs + (r0 + r) * dp + c) * x;
      }
      if (c < D) {
        const vf x = load_tail<T>(krow + c, D - c);
        for (int r = 0; r < RR; ++r) acc[r] += loadu(qs + (r0 + r) * dp + c) * x;
      }
      for (int r = 0; r < RR; ++r) tt[r][k] = acc[r];
    }
    for (int k = nb; k < VL; ++k)
      for (int r = 0; r < RR; ++r) tt[r][k] = splat(0.f);
    for (int r = 0; r < RR; ++r) storeu(S + r * kBK + jb, hsum_many(tt[r]));
  }
  // Transforms, mask and online softmax, vectorised over keys.
  vf iota;
  for (int i = 0; i < VL; ++i) iota[i] = float(i);
  float alpha[RR];
  const int nkp = round_up(nk, VL);
  for (int r = 0; r < RR; ++r) {
    const int row = r0 + r;
    const float lo = std::max(R.lo[row], float(j0)), hi = std::min(R.hi[row], float(j0 + nk));
    const vf pos = splat(R.pos[row]), slope = splat(R.slope[row]);
    float* srow = S + r * kBK;
    vf mt = splat(-INFINITY);
    for (int jb = 0; jb < nkp; jb += VL) {
      vf s = loadu(srow + jb);
      if (cap > 0.f) s = cap * vtanh(s * (1.f / cap));
      const vf jf = iota + float(j0 + jb);
      if (alibi) {
        const vf dist = pos - jf;
        s -= slope * (dist < 0.f ? -dist : dist);
      }
      s = ((jf >= lo) & (jf < hi)) ? s : splat(-INFINITY);
      storeu(srow + jb, s);
      mt = vmax(mt, s);
    }
    SoftmaxState st{m[row], l[row]};
    alpha[r] = attn_softmax_rescale(st, hmax(mt));
    const float base = attn_exp_base(st.m);
    vf sum = splat(0.f);
    for (int jb = 0; jb < nkp; jb += VL) {
      const vf e = vexp(loadu(srow + jb) - base);
      storeu(srow + jb, e);
      sum += e;
    }
    m[row] = st.m;
    l[row] = st.l + hsum(sum);
  }
  // O = alpha * O + P.V, V converted in registers, each load shared by the RR rows.
  constexpr int NV = kNR;
  int d0 = 0;
  for (; d0 + NV * VL <= dfull; d0 += NV * VL) {
    vf acc[RR][NV];
    for (int r = 0; r < RR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = loadu(O + (r0 + r) * dp + d0 + v * VL) * alpha[r];
    for (int j = 0; j < nk; ++j) {
      if (d0 == 0 && j < nn) prefetch_row(vn[j], row_bytes);
      vf x[NV];
      for (int v = 0; v < NV; ++v) x[v] = load<T>(vr[j] + d0 + v * VL);
      for (int r = 0; r < RR; ++r) {
        const vf pb = splat(S[r * kBK + j]);
        for (int v = 0; v < NV; ++v) acc[r][v] += pb * x[v];
      }
    }
    for (int r = 0; r < RR; ++r)
      for (int v = 0; v < NV; ++v) storeu(O + (r0 + r) * dp + d0 + v * VL, acc[r][v]);
  }
  for (; d0 < D; d0 += VL) {  // remaining vectors one at a time (the last may be partial)
    const int n = std::min(VL, D - d0);
    vf acc[RR];
    for (int r = 0; r < RR; ++r) acc[r] = loadu(O + (r0 + r) * dp + d0) * alpha[r];
    for (int j = 0; j < nk; ++j) {
      const vf x = n == VL ? load<T>(vr[j] + d0) : load_tail<T>(vr[j] + d0, n);
      for (int r = 0; r < RR; ++r) acc[r] += splat(S[r * kBK + j]) * x;
    }
    for (int r = 0; r < RR; ++r) storeu(O + (r0 + r) * dp + d0, acc[r]);
  }
}

template <DType T>
void small_impl(const AttnParams& p, const Task& t, Scratch& sc) {
  const int D = p.head_dim, dp = round_up(D, VL), G = p.num_heads / p.num_kv_heads;
  const int M = t.nh * G * t.nq, Mp = round_up(M, VL), Mh = G * t.nq;
  sc.dp = dp;
  float* O = sc.o.get(size_t(M) * dp);
  float* m = sc.m.get(Mp);
  float* l = sc.l.get(Mp);
  float* qs = sc.q.get(size_t(M) * dp);
  float* S = sc.s.get(size_t(4) * kBK);
  const Rows R = make_rows(p, t, G, Mp, sc.aux.get(4 * size_t(Mp)));
  memset(O, 0, sizeof(float) * M * dp);
  for (int r = 0; r < M; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (R.klo >= R.khi) return;
  for (int r = 0; r < M; ++r)
    row_to_f32<T>(q_row<T>(p, t.b, t.i0 + r % t.nq, t.kvh * G + r / t.nq), D, p.softmax_scale,
                  qs + r * dp);
  // Row pointers (head kvh) of the current and the next tile, double-buffered for the prefetch;
  // head kvh + hh is hh * head_stride further.
  const E<T>* rows[2][2][kBK];
  auto fill = [&](int j0, int n, const E<T>** kr, const E<T>** vr) {
    for (int jj = 0; jj < n; ++jj) {
      kr[jj] = kv_row<T>(p, false, t.b, j0 + jj, t.kvh);
      vr[jj] = kv_row<T>(p, true, t.b, j0 + jj, t.kvh);
    }
  };
  const bool alibi = p.alibi_slopes != nullptr;
  int cur = 0;
  fill(R.klo, std::min(kBK, R.khi - R.klo), rows[0][0], rows[0][1]);
  const E<T>* kh[kBK];
  const E<T>* vh[kBK];
  const E<T>* khn[kBK];
  const E<T>* vhn[kBK];
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK, cur ^= 1) {
    const int nk = std::min(kBK, R.khi - j0);
    const int nn = std::max(0, std::min(kBK, R.khi - j0 - kBK));
    fill(j0 + kBK, nn, rows[cur ^ 1][0], rows[cur ^ 1][1]);
    for (int hh = 0; hh < t.nh; ++hh) {
      const int64_t ko = int64_t(hh) * p.k_head_stride, vo = int64_t(hh) * p.v_head_stride;
      for (int jj = 0; jj < nk; ++jj) kh[jj] = rows[cur][0][jj] + ko, vh[jj] = rows[cur][1][jj] + vo;
      // Passes run (tile, head) in order; each prefetches the rows of the next pass.
      const bool last = hh + 1 == t.nh;
      const int np = last ? nn : nk;
      const int64_t kno = last ? 0 : ko + p.k_head_stride, vno = last ? 0 : vo + p.v_head_stride;
      const int nb = last ? cur ^ 1 : cur;
      for (int jj = 0; jj < np; ++jj) khn[jj] = rows[nb][0][jj] + kno, vhn[jj] = rows[nb][1][jj] + vno;
      for (int c0 = 0; c0 < Mh; c0 += 4) {
        const int r0 = hh * Mh + c0;
        const int pn = c0 == 0 ? np : 0;  // the head's first chunk issues the prefetches
        switch (std::min(4, Mh - c0)) {
          case 4: small_chunk<T, 4>(qs, dp, D, kh, vh, j0, nk, R, r0, p.softcap, alibi, S, O, m, l, khn, vhn, pn); break;
          case 3: small_chunk<T, 3>(qs, dp, D, kh, vh, j0, nk, R, r0, p.softcap, alibi, S, O, m, l, khn, vhn, pn); break;
          case 2: small_chunk<T, 2>(qs, dp, D, kh, vh, j0, nk, R, r0, p.softcap, alibi, S, O, m, l, khn, vhn, pn); break;
          default: small_chunk<T, 1>(qs, dp, D, kh, vh, j0, nk, R, r0, p.softcap, alibi, S, O, m, l, khn, vhn, pn); break;
        }
      }
    }
  }
}

}  // namespace

void attend_gemm(const AttnParams& p, const Task& t, Scratch& sc) {
  switch (p.dtype) {
    case DType::F16: gemm_impl<DType::F16>(p, t, sc); break;
    case DType::BF16: gemm_impl<DType::BF16>(p, t, sc); break;
    default: gemm_impl<DType::F32>(p, t, sc); break;
  }
}

void attend_small(const AttnParams& p, const Task& t, Scratch& sc) {
  switch (p.dtype) {
    case DType::F16: small_impl<DType::F16>(p, t, sc); break;
    case DType::BF16: small_impl<DType::BF16>(p, t, sc); break;
    default: small_impl<DType::F32>(p, t, sc); break;
  }
}

}  // namespace attn
LLMK_NS_END
