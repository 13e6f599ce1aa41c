// CPU attention GEMM tile kernel, attend_gemm (prefill, many rows; one build per SIMD level):
// register-blocked Q.K^T and P.V over key tiles, with the rows in the vector lanes, in fp32 and,
// on AVX512_BF16 CPUs, on bf16 pairs (vdpbf16ps). The overview of both tile kernels is at the top
// of flash_attn_tiles_cpu.cpp.
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"
#include "attention/flash_attn_tiles_cpu.h"

LLMK_NS_BEGIN
namespace attn {

// s * scale, rounded to fp32 on its own: the product a separate scaling pass stored. The barrier
// keeps the compiler from fusing it into the subtraction that follows (an FMA skips the rounding,
// and the bits would differ from the kernels that scale first).
LLMK_ALWAYS_INLINE vf scaled_score(vf s, vf scale) {
  vf x = s * scale;
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(x));
#else
  asm("" : "+m"(x));
#endif
  return x;
}

// Scores S^T [nk][Mp] of one tile, times `scale` -> probabilities exp(s * scale - m_new), with the
// running max m, sum l and the output scale alpha of every row (lane-wise: rows are the vector
// lanes). The scale is applied as each score is read (the same product a pass of its own stored).
// With kPairs (the AMX kernel), the probabilities are not stored back into S but written as P^T
// in bf16 key pairs, Pp [np][Mp] (key 2i in the low half of word i, zero past nk), straight from
// the exponential: the separate packing pass re-read every probability.
template <bool kPairs>
LLMK_ALWAYS_INLINE void softmax_tile_impl(float* S, int Mp, int nk, int j0, const Rows& R, bool full, float cap,
                                          bool alibi, float* m, float* l, float* alpha, float scale,
                                          uint32_t* Pp, int np, bool cvt) {
  const float inv_cap = cap > 0.f ? 1.f / cap : 0.f;
  const vf sc = splat(scale);
  const bool plain = cap <= 0.f && !alibi && full;  // the common case: scores stay as they are
  const bool scaled = scale != 1.f;
  // max(s) * scale is max(s * scale) to the bit for a positive scale (rounding is monotonic):
  // one multiply per row vector instead of one per score
  const bool scale_max = scaled && scale > 0.f;
  for (int o = 0; o < Mp; o += VL) {
    const vf lo = loadu(R.lo + o), hi = loadu(R.hi + o), pos = loadu(R.pos + o);
    const vf slope = loadu(R.slope + o);
    vf mt = splat(-INFINITY);
    if (plain) {
      for (int jj = 0; jj < nk; ++jj) {
        const vf s = loadu(S + jj * Mp + o);
        mt = vmax(mt, scaled && !scale_max ? s * sc : s);
      }
      if (scale_max) mt = mt * sc;
    } else for (int jj = 0; jj < nk; ++jj) {
      float* sp = S + jj * Mp + o;
      vf s = scaled ? scaled_score(loadu(sp), sc) : loadu(sp);
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
    const vf a = exp_nonpos(mo - base);
    vf sum = splat(0.f);
    const bool rescale = plain && scaled;  // the other path stored its transformed scores
    if constexpr (kPairs) {
#if defined(__AVX512F__)
      // exp(s * scale - base) as 2^(s * scale * log2(e) - base * log2(e)), one FMA before the
      // exponential instead of a multiply, a subtraction and the exponential's own multiply (the
      // probabilities move by a rounding of the argument; this kernel's sums are its own anyway)
      const vf c = splat((rescale ? scale : 1.f) * kLog2e), nb = base * splat(-kLog2e);
      auto prob2 = [&](int jj) { return reinterpret_cast<vf>(_mm512_fmadd_ps(loadu(S + jj * Mp + o), c, nb)); };
      for (int jp = 0; jp < np; ++jp) {
        vf e0 = splat(0.f), e1 = splat(0.f);
        if (2 * jp + 1 < nk) {
          vf x[2] = {prob2(2 * jp), prob2(2 * jp + 1)}, e[2];
          exp2_nonpos_n<2>(x, e);
          e0 = e[0], e1 = e[1];
          sum += e0;
          sum += e1;
        } else if (2 * jp < nk) {
          vf x[1] = {prob2(2 * jp)};
          exp2_nonpos_n<1>(x, &e0);
          sum += e0;
        }
        __m512i words;
        if (cvt) {
          // unlike to_bf16_bits_cvt, no check for denormal inputs, which vcvtne2ps2bf16 flushes to
          // zero: a probability below 2^-126 of its row's maximum weighs 0 in P.V (l keeps it)
          words = bf16_pairs_cvt(e0, e1);
        } else {
          const vh h0 = to_bf16_bits(e0), h1 = to_bf16_bits(e1);
          words = bf16_pair_words(reinterpret_cast<__m256i>(h0), reinterpret_cast<__m256i>(h1));
        }
        _mm512_storeu_si512(Pp + int64_t(jp) * Mp + o, words);
      }
#endif
    } else {
      for (int jj = 0; jj < nk; ++jj) {
        float* sp = S + jj * Mp + o;
        const vf e = exp_nonpos((rescale ? scaled_score(loadu(sp), sc) : loadu(sp)) - base);
        storeu(sp, e);
        sum += e;
      }
    }
    storeu(l + o, loadu(l + o) * a + sum);
    storeu(m + o, mn);
    storeu(alpha + o, a);
  }
}

void softmax_tile(float* S, int Mp, int nk, int j0, const Rows& R, bool full, float cap,
                  bool alibi, float* m, float* l, float* alpha, float scale) {
  softmax_tile_impl<false>(S, Mp, nk, j0, R, full, cap, alibi, m, l, alpha, scale, nullptr, 0, false);
}

#if defined(__AVX512F__)
void softmax_tile_pairs(float* S, int Mp, int nk, int j0, const Rows& R, bool full, float cap, bool alibi,
                        float* m, float* l, float* alpha, float scale, uint32_t* Pp, int np, bool cvt) {
  softmax_tile_impl<true>(S, Mp, nk, j0, R, full, cap, alibi, m, l, alpha, scale, Pp, np, cvt);
}
#endif

void pack_q_pairs(const AttnParams& p, const Task& t, int G, int M, int Mp, uint32_t* Qp) {
  const int dpairs = p.head_dim / 2;
  if (Mp != M) memset(Qp, 0, sizeof(uint32_t) * dpairs * Mp);
#if defined(__AVX512F__)
  if (dpairs % 16 == 0) {  // 16 rows x 16 pairs at a time, transposed in registers: bf16 attention
    // over 4 x 256 tokens ran ~10% faster than with the pair words one by one below
    for (int r0 = 0; r0 < M; r0 += 16) {
      const uint16_t* src[16];
      for (int j = 0; j < 16; ++j)
        src[j] = r0 + j < M ? task_q_row<DType::BF16>(p, t, G, r0 + j) : nullptr;
      for (int i0 = 0; i0 < dpairs; i0 += 16) {
        __m512i w[16];
        for (int j = 0; j < 16; ++j) w[j] = src[j] ? _mm512_loadu_si512(src[j] + 2 * i0) : _mm512_setzero_si512();
        transpose16_epi32(w);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(Qp + int64_t(i0 + i) * Mp + r0, w[i]);
      }
    }
    return;
  }
#endif
  for (int r = 0; r < M; ++r) {
    const uint16_t* src = task_q_row<DType::BF16>(p, t, G, r);
    for (int i = 0; i < dpairs; ++i) memcpy(Qp + int64_t(i) * Mp + r, src + 2 * i, 4);
  }
}

namespace {

#if defined(__AVX512F__)
// AVX512_BF16 (Zen 4, Sapphire Rapids, ...): vdpbf16ps multiplies pairs of bf16 values exactly
// and accumulates them in fp32, twice the work of an fp32 FMA per instruction and no widening.
// The build's AVX-512 flags do not include the extension, so only the functions that use it are
// compiled for it (target attribute) and they run when the CPU reports it.
// LLMKERN_ATTN_BF16_DOT=0 turns it off (to test the widening path on such CPUs).
#define LLMK_BF16_TARGET __attribute__((target("avx512bf16")))
#endif

// ---- GEMM micro-kernels -----------------------------------------------------------------------

// s[k][v*VL..] = sum_d kr[k][d] * qt[d][v*VL..] for MK keys (fp32 rows kr[k]) x NV row vectors.
template <int MK, int NV>
void qk_micro(const float* __restrict qt, int ldq, const float* const* kr, int D, float* __restrict s, int lds) {
  vf acc[MK][NV];
  const float* k_[MK];
  for (int k = 0; k < MK; ++k) k_[k] = kr[k];
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) acc[k][v] = splat(0.f);
  for (int d = 0; d < D; ++d) {
    vf q[NV];
    for (int v = 0; v < NV; ++v) q[v] = loadu(qt + int64_t(d) * ldq + v * VL);
    for (int k = 0; k < MK; ++k) {
      const vf kb = splat(k_[k][d]);
      for (int v = 0; v < NV; ++v) acc[k][v] += kb * q[v];
    }
  }
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) storeu(s + k * lds + v * VL, acc[k][v]);
}

// o[r][v*VL..] = alpha[r] * o[r][..] + sum_j pt[j][r] * vr[j][d0 + v*VL..] for MR rows x NV vectors
// (fp32 rows vr[j]).
template <int MR, int NV>
void pv_micro(float* __restrict o, int ldo, const float* __restrict alpha,
              const float* __restrict pt, int ldp, const float* const* vr, int d0, int nk) {
  vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = loadu(o + r * ldo + v * VL) * alpha[r];
  for (int j = 0; j < nk; ++j) {
    vf x[NV];
    for (int v = 0; v < NV; ++v) x[v] = loadu(vr[j] + d0 + v * VL);
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

// Q^T [D][Mp] of the task's M rows (r = g * nq + qi), each scaled by softmax_scale; lanes past M
// are left as they are.
template <DType T>
void pack_q_t(const AttnParams& p, const Task& t, int G, int M, int Mp, float* Qt) {
  const int D = p.head_dim;
  int r0 = 0;
#if defined(__AVX512F__)
  if constexpr (T == DType::F32) {
    // 16 rows x 16 features at a time, transposed in registers: the element loop's scattered
    // stores were ~9% of an fp32 prefill's attention (8 x 256 tokens, 9 / 3 heads)
    const __m512 scale = _mm512_set1_ps(p.softmax_scale);
    for (; r0 + 16 <= M && D % 16 == 0; r0 += 16) {
      const float* src[16];
      for (int j = 0; j < 16; ++j) src[j] = task_q_row<T>(p, t, G, r0 + j);
      for (int d0 = 0; d0 < D; d0 += 16) {
        __m512i w[16];
        for (int j = 0; j < 16; ++j) w[j] = _mm512_castps_si512(_mm512_loadu_ps(src[j] + d0));
        transpose16_epi32(w);
        for (int i = 0; i < 16; ++i)
          _mm512_storeu_ps(Qt + int64_t(d0 + i) * Mp + r0, _mm512_mul_ps(_mm512_castsi512_ps(w[i]), scale));
      }
    }
  }
#endif
  for (int r = r0; r < M; ++r) {
    const E<T>* src = task_q_row<T>(p, t, G, r);
    for (int d = 0; d < D; ++d) Qt[int64_t(d) * Mp + r] = to_f32<T>(src[d]) * p.softmax_scale;
  }
}

template <DType T>
void gemm_impl(const AttnParams& p, const Task& t, Scratch& sc) {
  const int D = p.head_dim, dp = round_up(D, VL), G = p.num_heads / p.num_kv_heads;
  const int M = G * t.nq, Mp = round_up(M, VL);
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
  pack_q_t<T>(p, t, G, M, Mp, Qt);

  // fp32 K / V rows are read where they are; other dtypes, and a head_dim off the vector width,
  // through fp32 copies (zero padded to dp).
  const bool in_place = T == DType::F32 && p.kv_quant == KvQuant::None && D == dp;
  const float* krow[kBK];
  const float* vrow[kBK];
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK) {
    const int nk = std::min(kBK, R.khi - j0);
    for (int jj = 0; jj < nk; ++jj) {
      if (in_place) {
        krow[jj] = reinterpret_cast<const float*>(kv_row<T>(p, false, t.b, j0 + jj, t.kvh));
        vrow[jj] = reinterpret_cast<const float*>(kv_row<T>(p, true, t.b, j0 + jj, t.kvh));
        continue;
      }
      kv_row_to_f32<T>(p, false, t.b, j0 + jj, t.kvh, Kf + jj * dp);
      kv_row_to_f32<T>(p, true, t.b, j0 + jj, t.kvh, Vf + jj * dp);
      krow[jj] = Kf + jj * dp;
      vrow[jj] = Vf + jj * dp;
    }
    // S^T[jj][r] = k_j . q_r
    for (int rv = 0; rv < Mp; rv += kNR * VL) {
      const int nv = std::min(kNR, (Mp - rv) / VL);
      for (int jj = 0; jj < nk; jj += kMR)
        Pick<QK, kMR, kNR>::run(std::min(kMR, nk - jj), nv, Qt + rv, Mp, krow + jj, D, S + jj * Mp + rv, Mp);
    }
    // Score transforms, masks and the online softmax, lane-wise over rows.
    softmax_tile(S, Mp, nk, j0, R, j0 >= R.full_lo && j0 + nk <= R.full_hi, p.softcap,
                 p.alibi_slopes != nullptr, m, l, alpha, 1.f);
    // O = alpha * O + P.V
    for (int r0 = 0; r0 < M; r0 += kMR) {
      const int mr = std::min(kMR, M - r0);
      for (int d0 = 0; d0 < dp; d0 += kNR * VL) {
        const int nv = std::min(kNR, (dp - d0) / VL);
        Pick<PV, kMR, kNR>::run(mr, nv, O + int64_t(r0) * dp + d0, dp, alpha + r0, S + r0, Mp, vrow, d0, nk);
      }
    }
  }
}

#if defined(__AVX512F__)
// ---- GEMM kernel for bf16 inputs with AVX512_BF16 ---------------------------------------------
//
// Same tiles as gemm_impl, with the reductions done on bf16 pairs: S^T = K.Q^T pairs over d (Q
// packed once per task as [D/2][Mp] pairs, K pairs broadcast straight from the cache rows), and
// O += P.V pairs over keys (P rounded to bf16, as flash-attn's tensor-core kernels do; V packed per
// tile as [keys/2][dp] pairs). The softmax stays in fp32.

template <int MK, int NV>
LLMK_BF16_TARGET void qk_bf16_micro(const uint32_t* __restrict qp, int ldq,
                                    const uint16_t* const* krow, int dpairs, float scale,
                                    float* __restrict s, int lds) {
  __m512 acc[MK][NV];
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) acc[k][v] = _mm512_setzero_ps();
  for (int i = 0; i < dpairs; ++i) {
    __m512i q[NV];
    for (int v = 0; v < NV; ++v) q[v] = _mm512_loadu_si512(qp + int64_t(i) * ldq + v * 16);
    for (int k = 0; k < MK; ++k) {
      uint32_t pair;
      memcpy(&pair, krow[k] + 2 * i, 4);
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(int(pair));
      for (int v = 0; v < NV; ++v) acc[k][v] = _mm512_dpbf16_ps(acc[k][v], (__m512bh)q[v], kb);
    }
  }
  for (int k = 0; k < MK; ++k)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s + k * lds + v * 16, _mm512_mul_ps(acc[k][v], _mm512_set1_ps(scale)));
}

template <int MR, int NV>
LLMK_BF16_TARGET void pv_bf16_micro(float* __restrict o, int ldo, const float* __restrict alpha,
                                    const uint32_t* __restrict pp, int ldp,
                                    const uint32_t* __restrict vp, int ldv, int npairs) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + v * 16), _mm512_set1_ps(alpha[r]));
  for (int j = 0; j < npairs; ++j) {
    __m512i x[NV];
    for (int v = 0; v < NV; ++v) x[v] = _mm512_loadu_si512(vp + int64_t(j) * ldv + v * 16);
    for (int r = 0; r < MR; ++r) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(int(pp[int64_t(j) * ldp + r]));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pb, (__m512bh)x[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + r * ldo + v * 16, acc[r][v]);
}

template <int MK, int NV>
struct QKb {
  template <typename... A>
  static void call(A... a) { qk_bf16_micro<MK, NV>(a...); }
};
template <int MR, int NV>
struct PVb {
  template <typename... A>
  static void call(A... a) { pv_bf16_micro<MR, NV>(a...); }
};

LLMK_BF16_TARGET void gemm_bf16(const AttnParams& p, const Task& t, Scratch& sc) {
  using E16 = uint16_t;
  const int D = p.head_dim, dp = round_up(D, VL), G = p.num_heads / p.num_kv_heads;
  const int M = G * t.nq, Mp = round_up(M, VL), dpairs = D / 2;
  sc.dp = dp;
  float* O = sc.o.get(size_t(M) * dp);
  float* m = sc.m.get(Mp);
  float* l = sc.l.get(Mp);
  uint32_t* Qp = reinterpret_cast<uint32_t*>(sc.q.get(size_t(dpairs) * Mp));
  float* S = sc.s.get(size_t(kBK) * Mp);
  uint32_t* Pp = reinterpret_cast<uint32_t*>(sc.k.get(size_t(kBK / 2) * Mp));
  uint32_t* Vp = reinterpret_cast<uint32_t*>(sc.v.get(size_t(kBK / 2) * dp));
  float* alpha = sc.t.get(Mp);
  const Rows R = make_rows(p, t, G, Mp, sc.aux.get(4 * size_t(Mp)));

  memset(O, 0, sizeof(float) * M * dp);
  for (int r = 0; r < Mp; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (R.klo >= R.khi) return;

  pack_q_pairs(p, t, G, M, Mp, Qp);
  const E16* krow[kBK + kMR];
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK) {
    const int nk = std::min(kBK, R.khi - j0), np = (nk + 1) / 2;
    for (int jj = 0; jj < nk; ++jj) krow[jj] = kv_row<DType::BF16>(p, false, t.b, j0 + jj, t.kvh);
    // V pairs: Vp[jp][d] = (V[2jp][d], V[2jp+1][d]); a missing odd row and the d padding are 0.
    for (int jp = 0; jp < np; ++jp) {
      const E16* v0 = kv_row<DType::BF16>(p, true, t.b, j0 + 2 * jp, t.kvh);
      const E16* v1 = 2 * jp + 1 < nk ? kv_row<DType::BF16>(p, true, t.b, j0 + 2 * jp + 1, t.kvh) : nullptr;
      uint32_t* dst = Vp + int64_t(jp) * dp;
      int d = 0;
      for (; d + 16 <= D; d += 16) {
        const __m512i a = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + d)));
        const __m512i b = v1 ? _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v1 + d)))
                             : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + d, _mm512_or_si512(a, _mm512_maskz_slli_epi32(0xffff, b, 16)));
      }
      for (; d < dp; ++d)
        dst[d] = d < D ? uint32_t(v0[d]) | (v1 ? uint32_t(v1[d]) << 16 : 0u) : 0u;
    }
    for (int rv = 0; rv < Mp; rv += kNR * VL) {
      const int nv = std::min(kNR, (Mp - rv) / VL);
      for (int jj = 0; jj < nk; jj += kMR)
        Pick<QKb, kMR, kNR>::run(std::min(kMR, nk - jj), nv, Qp + rv, Mp, krow + jj, dpairs,
                                 p.softmax_scale, S + jj * Mp + rv, Mp);
    }
    softmax_tile(S, Mp, nk, j0, R, j0 >= R.full_lo && j0 + nk <= R.full_hi, p.softcap,
                 p.alibi_slopes != nullptr, m, l, alpha, 1.f);
    // P pairs over keys, per row lane.
    for (int jp = 0; jp < np; ++jp)
      for (int o = 0; o < Mp; o += VL) {
        const __m512 a = _mm512_loadu_ps(S + (2 * jp) * Mp + o);
        const __m512 b = 2 * jp + 1 < nk ? _mm512_loadu_ps(S + (2 * jp + 1) * Mp + o) : _mm512_setzero_ps();
        _mm512_storeu_si512(Pp + int64_t(jp) * Mp + o, bf16_pairs_cvt(a, b));
      }
    for (int r0 = 0; r0 < M; r0 += kMR) {
      const int mr = std::min(kMR, M - r0);
      for (int d0 = 0; d0 < dp; d0 += kNR * VL) {
        const int nv = std::min(kNR, (dp - d0) / VL);
        Pick<PVb, kMR, kNR>::run(mr, nv, O + int64_t(r0) * dp + d0, dp, alpha + r0, Pp + r0, Mp,
                                 Vp + d0, dp, np);
      }
    }
  }
}
#endif

}  // namespace

void attend_gemm(const AttnParams& p, const Task& t, Scratch& sc) {
  if (attend_gemm_amx(p, t, sc)) return;
#if defined(__AVX512F__)
  if (p.dtype == DType::BF16 && cpu_bf16_dot() && p.kv_quant == KvQuant::None)
    return gemm_bf16(p, t, sc);
#endif
  switch (p.dtype) {
    case DType::F16: gemm_impl<DType::F16>(p, t, sc); break;
    case DType::BF16: gemm_impl<DType::BF16>(p, t, sc); break;
    default: gemm_impl<DType::F32>(p, t, sc); break;
  }
}

}  // namespace attn
LLMK_NS_END
