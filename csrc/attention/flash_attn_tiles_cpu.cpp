// CPU attention tile kernels (one build per SIMD level). Both take a Task (query rows of one
// sequence sharing a kv head, one key range) and leave in the thread's Scratch the un-normalised
// fp32 output O[r][d] and the softmax state (m, l) of every row, after an online softmax over
// key tiles of kBK keys.
//
// attend_gemm (prefill, many rows): K and V tiles are read in place when they are fp32 (else
// converted once to fp32 [kBK][dp]), Q once per task to Q^T [D][Mp] (scaled). S^T = K.Q^T is a register-blocked GEMM with the rows in the
// vector lanes, which makes the softmax (max / exp / sum over keys) purely lane-wise; O += P.V is
// a second register-blocked GEMM broadcasting P.
//
// attend_small (decode and short appends, few rows; one task covers all kv heads of a sequence):
// K/V rows are read straight from the cache and converted in registers; every load serves all
// rows of the group. Tiles are small (kSmallTile keys) and the passes over one tile prefetch all
// of the next, in address order and spread over their loops. Dot products are reduced VL keys at
// a time by a transposing tree.
//
// bf16 on CPUs with AVX512_BF16: the GEMM kernel uses vdpbf16ps (pairs of bf16 products summed in
// fp32) for q.k and p.v, with P rounded to bf16 for p.v as flash-attn's tensor-core kernels do.
// Decode at head_dim multiples of 32 goes to flash_decode_cpu.cpp (the same arithmetic); here the
// other dims use vdpbf16ps for q.k only.
//
// This file: the small-rows kernel (attend_small) and what both kernels share (make_rows,
// cpu_bf16_dot); the GEMM kernel is in flash_attn_gemm_cpu.cpp, the tile sizes in
// flash_attn_tiles_cpu.h.
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"
#include "attention/flash_attn_tiles_cpu.h"
#include "common/dispatch.h"

LLMK_NS_BEGIN
namespace attn {
namespace {

// ---- decode kernel ----------------------------------------------------------------------------

// Keys per small-rows tile. The passes over a tile prefetch all of the next, which must not be
// evicted before it is read. Zen 2 (AVX2), with the prefetch stream below, both threads from
// memory: 64-key tiles read 14-20% slower than 32 (9 / 3 heads x 64 and 32 / 8 x 128 fp32);
// 16 keys as fast or faster at those two, but slower in cache, at 7 / 1 x 80, 32 / 8 x 64 and
// 28 / 4 x 128 (the per-tile work comes twice as often; docs/cpu.md). AVX-512 keeps the 64 it was
// tuned with (on Zen 4, 32 keys read no faster from memory).
#if defined(__AVX512F__)
constexpr int kSmallTile = 64;
#else
constexpr int kSmallTile = 32;
#endif
static_assert(kSmallTile % VL == 0 && kSmallTile <= kBK, "S rows hold kBK keys");

// The next tile's K and V rows, prefetched a line at a time at a steady rate over all of the
// current tile's loops (q.k, softmax and p.v of every kv head). A stretch of work that issues no
// prefetch lets the memory queue run dry, and its time then adds to the reads' instead of
// overlapping them: with the prefetches issued only from the q.k and p.v loops, a dummy loop added
// to each pass cost its full time from memory too (docs/cpu.md).
template <typename Elem>
struct RowStream {
  const Elem* const* k = nullptr;  // the next tile's rows of the task's first kv head
  const Elem* const* v = nullptr;
  int64_t kstride = 0, vstride = 0;  // elements from one kv head to the next
  int nkeys = 0, nh = 1, bytes = 0;
  int key = 0, h = 0;
  bool on_v = false;
  uintptr_t p = 0, end = 0;  // the row being prefetched: its next line and its end
  int64_t credit = 0, lines = 0, units = 1;  // `lines` prefetches per `units` of work

  // Rows in address order of a paged block: K then V of (key, head), heads inner.
  void start(const Elem* const* kr, const Elem* const* vr, int64_t ks, int64_t vs, int n, int heads,
             int row_len, int64_t work) {
    k = kr, v = vr, kstride = ks, vstride = vs, nkeys = n, nh = heads;
    bytes = row_len * int(sizeof(Elem));
    key = h = 0, on_v = false, p = end = 0, credit = 0;
    lines = int64_t(n) * heads * 2 * ((bytes + 63) / 64);
    units = std::max<int64_t>(work, 1);
  }
  // One line: a line at a time keeps the requests evenly spaced (a whole row at a time read ~10%
  // slower from memory with rows of 512 bytes).
  LLMK_ALWAYS_INLINE void one() {
    if (p >= end) {
      if (key == nkeys) return;
      const Elem* r = on_v ? v[key] + h * vstride : k[key] + h * kstride;
      if (on_v && ++h == nh) h = 0, ++key;
      on_v = !on_v;
      p = reinterpret_cast<uintptr_t>(r) & ~uintptr_t(63);
      end = reinterpret_cast<uintptr_t>(r) + bytes;
    }
    __builtin_prefetch(reinterpret_cast<const void*>(p), 0, 1);
    p += 64;
  }
  // u units of work done: the prefetches they pay for.
  LLMK_ALWAYS_INLINE void spend(int u) {
    credit += int64_t(u) * lines;
    while (credit >= units) credit -= units, one();
  }
  // What misaligned rows or a rounded rate left over.
  void finish() {
    while (key < nkeys || p < end) one();
  }
};

#if defined(__AVX512F__)
// Decode q.k for bf16 inputs with AVX512_BF16 (see gemm_bf16 in flash_attn_gemm_cpu.cpp): pairs of
// bf16 products summed in fp32, no conversion of K.
template <int RR>
__attribute__((target("avx512bf16"))) void qk_dot_bf16(const uint16_t* const* q,
                                                       const uint16_t* const* kr, int nk, int D,
                                                       float scale, float* S,
                                                       RowStream<uint16_t>& pfr) {
  RowStream<uint16_t> pf = pfr;  // in registers (see small_qk)
  const int nfull = D / 32 * 32, tail = D % 32;
  const __mmask32 tmask = tail ? static_cast<__mmask32>((1u << tail) - 1) : 0;
  const int work = RR * 2 * ((D + VL - 1) / VL);  // as small_qk counts it
  for (int jb = 0; jb < nk; jb += VL) {
    const int nb = std::min(VL, nk - jb);
    vf tt[RR][VL];
    // Two keys per step: independent accumulator chains and one q load for both.
    for (int k = 0; k < nb; k += 2) {
      const uint16_t* k0 = kr[jb + k];
      const uint16_t* k1 = k + 1 < nb ? kr[jb + k + 1] : k0;
      pf.spend(work);
      __m512 a0[RR], a1[RR];
      for (int r = 0; r < RR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
      for (int c = 0; c < nfull; c += 32) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(k0 + c);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(k1 + c);
        for (int r = 0; r < RR; ++r) {
          const __m512bh qv = (__m512bh)_mm512_loadu_si512(q[r] + c);
          a0[r] = _mm512_dpbf16_ps(a0[r], qv, x0);
          a1[r] = _mm512_dpbf16_ps(a1[r], qv, x1);
        }
      }
      if (tail) {
        const __m512bh x0 = (__m512bh)_mm512_maskz_loadu_epi16(tmask, k0 + nfull);
        const __m512bh x1 = (__m512bh)_mm512_maskz_loadu_epi16(tmask, k1 + nfull);
        for (int r = 0; r < RR; ++r) {
          const __m512bh qv = (__m512bh)_mm512_maskz_loadu_epi16(tmask, q[r] + nfull);
          a0[r] = _mm512_dpbf16_ps(a0[r], qv, x0);
          a1[r] = _mm512_dpbf16_ps(a1[r], qv, x1);
        }
      }
      for (int r = 0; r < RR; ++r) {
        tt[r][k] = a0[r];
        if (k + 1 < nb) tt[r][k + 1] = a1[r];
      }
    }
    for (int k = nb; k < VL; ++k)
      for (int r = 0; r < RR; ++r) tt[r][k] = splat(0.f);
    for (int r = 0; r < RR; ++r) storeu(S + r * kBK + jb, hsum_many(tt[r]) * scale);
  }
  pfr = pf;
}
#endif

// Independent FMA chains the few-rows loops keep in flight: an FMA's latency times the two FMA
// ports. With one to three rows, one chain per (row, key) or per (row, output vector) leaves most
// of that idle, so those loops take more keys (q.k) or more output vectors (p.v) per step; each
// chain still sums in the same order, so every choice gives the same bits.
constexpr int kChains = 8;
// Keys per q.k step. On AVX2 three rows take three keys (nine chains; a fourth key would spill
// its 16 registers), and the last step of each 8-key group repeats a key it does not store (one
// FMA in nine wasted). Other widths keep steps that divide VL (two keys for three rows; AVX-512
// not re-measured).
template <int RR>
constexpr int qk_keys() {
  constexpr int ks = RR * 2 >= kChains ? 2 : (kChains + RR - 1) / RR;
  return std::min(VL, VL % ks == 0 || VL == 8 ? ks : kChains / RR);
}
template <int RR>
constexpr int pv_vectors() { return RR * kNR >= kChains ? kNR : (kChains + RR - 1) / RR; }  // vectors per p.v step

// The unit the prefetch rate is counted in: one vector FMA of q.k or p.v (for each row); a row's
// softmax (mask, max, exp and sum) counts kSoftmaxWork per vector of keys, about its time.
constexpr int kSoftmaxWork = 24;
inline int softmax_work(int nk) { return (nk + VL - 1) / VL * kSoftmaxWork; }

// Work of rows r .. r+RR-1 against nk keys, counted as the loops spend it.
template <int RR>
int chunk_work(int nk, int D) {
  constexpr int KS = qk_keys<RR>();
  const int ncol = (D + VL - 1) / VL;
  int steps = 0;
  for (int jb = 0; jb < nk; jb += VL) steps += (std::min(VL, nk - jb) + KS - 1) / KS;
  return steps * RR * KS * ncol + RR * softmax_work(nk) + nk * RR * ncol;
}

// f(std::integral_constant<int, RR>{}) for a chunk of RR = min(4, n) rows: the chunks the decode
// kernel takes a kv head's group in.
template <class F>
LLMK_ALWAYS_INLINE void with_chunk_rows(int n, F&& f) {
  switch (std::min(4, n)) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

// All Mh rows of one kv head's group, in the chunks small_rows takes.
inline int64_t group_work(int Mh, int nk, int D) {
  int64_t w = 0;
  for (int c0 = 0; c0 < Mh; c0 += 4)
    with_chunk_rows(Mh - c0, [&](auto rr) { w += chunk_work<decltype(rr)::value>(nk, D); });
  return w;
}

// Keeps v in a register: GCC otherwise folds a q load into each of the KS FMAs that use it as a
// memory operand, and AVX2's two loads per cycle, not its FMAs, then bound the q.k loop.
LLMK_ALWAYS_INLINE void in_register(vf& v) {
#if defined(__AVX512F__)
  (void)v;  // 32 registers: left to the compiler
#else
  asm("" : "+x"(v));
#endif
}

// S[r][jj] = q_r . k_j for RR rows, KS keys per step (one q load for all), reduced VL keys at a
// time by the transposing tree.
template <DType T, int RR>
LLMK_ALWAYS_INLINE void small_qk(const float* __restrict qs, int dp, int D, const E<T>* const* kr, int nk,
                                 int r0, float* S, RowStream<E<T>>& pfr) {
  // A local copy keeps the stream in registers; through the reference its fields were stored and
  // reloaded at every line (4-5% of the kernel's time in cache).
  RowStream<E<T>> pf = pfr;
  constexpr int KS = qk_keys<RR>();
  static_assert(KS <= VL, "a q.k step stays inside one reduction group");
  const int dfull = D / VL * VL;
  const int work = RR * KS * ((D + VL - 1) / VL);
  for (int jb = 0; jb < nk; jb += VL) {
    const int nb = std::min(VL, nk - jb);
    vf tt[RR][VL];
    for (int k = 0; k < nb; k += KS) {
      const E<T>* kp[KS];
      // Past nb: a repeat of the last key, not stored.
      for (int s = 0; s < KS; ++s) kp[s] = kr[jb + std::min(k + s, nb - 1)];
      pf.spend(work);
      vf a[RR][KS];
      for (int r = 0; r < RR; ++r)
        for (int s = 0; s < KS; ++s) a[r][s] = splat(0.f);
      // One vector of head_dim at c for the KS keys, loaded by load_k (whole or the partial last).
      const auto step = [&](int c, auto load_k) __attribute__((always_inline)) {
        vf x[KS];
        for (int s = 0; s < KS; ++s) x[s] = load_k(kp[s] + c);
        for (int r = 0; r < RR; ++r) {
          vf qv = loadu(qs + (r0 + r) * dp + c);
          in_register(qv);
          for (int s = 0; s < KS; ++s) a[r][s] += qv * x[s];
        }
      };
      int c = 0;
      for (; c < dfull; c += VL) step(c, [](const E<T>* p) { return load<T>(p); });
      if (c < D) step(c, [&](const E<T>* p) { return load_tail<T>(p, D - c); });
      for (int r = 0; r < RR; ++r)
        for (int s = 0; s < KS && k + s < nb; ++s) tt[r][k + s] = a[r][s];
    }
    for (int k = nb; k < VL; ++k)
      for (int r = 0; r < RR; ++r) tt[r][k] = splat(0.f);
    for (int r = 0; r < RR; ++r) storeu(S + r * kBK + jb, hsum_many(tt[r]));
  }
  pfr = pf;
}

// O[r][d0, d0 + NV*VL) = alpha[r] O[r] + sum_j P[r][j] v_j, V converted in registers, each load
// shared by the RR rows.
template <DType T, int RR, int NV>
LLMK_ALWAYS_INLINE void small_pv_block(const float* S, const E<T>* const* vr, int nk, float* O, int dp, int d0,
                                       const float* alpha, RowStream<E<T>>& pfr) {
  RowStream<E<T>> pf = pfr;
  vf acc[RR][NV];
  for (int r = 0; r < RR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = loadu(O + r * dp + d0 + v * VL) * alpha[r];
  for (int j = 0; j < nk; ++j) {
    pf.spend(RR * NV);
    // one pointer per key, its vectors at constant offsets: left to itself GCC indexed each load by
    // d0 + v * VL, kept those NV offsets on the stack (the stream's fields hold the registers) and
    // reloaded them for every key
    const E<T>* vp = vr[j] + d0;
    asm("" : "+r"(vp));
    vf x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load<T>(vp + v * VL);
    for (int r = 0; r < RR; ++r) {
      const vf pb = splat(S[r * kBK + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] += pb * x[v];
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int v = 0; v < NV; ++v) storeu(O + r * dp + d0 + v * VL, acc[r][v]);
  pfr = pf;
}

// The last n full vectors of a row (1 <= n <= N) in one block of exactly n.
template <DType T, int RR, int N>
LLMK_ALWAYS_INLINE void small_pv_rest(int n, const float* S, const E<T>* const* vr, int nk, float* O, int dp,
                                      int d0, const float* alpha, RowStream<E<T>>& pf) {
  if (n == N) return small_pv_block<T, RR, N>(S, vr, nk, O, dp, d0, alpha, pf);
  if constexpr (N > 1) small_pv_rest<T, RR, N - 1>(n, S, vr, nk, O, dp, d0, alpha, pf);
}

template <DType T, int RR>
LLMK_ALWAYS_INLINE void small_pv(const float* S, const E<T>* const* vr, int nk, float* O, int dp, int D,
                                 const float* alpha, RowStream<E<T>>& pf) {
  constexpr int NV = pv_vectors<RR>();
  const int dfull = D / VL * VL;
  int d0 = 0;
  for (; d0 + NV * VL <= dfull; d0 += NV * VL) small_pv_block<T, RR, NV>(S, vr, nk, O, dp, d0, alpha, pf);
  if constexpr (NV > 1) {  // the rest of the full vectors in one block
    const int rest = (dfull - d0) / VL;
    if (rest > 0) small_pv_rest<T, RR, NV - 1>(rest, S, vr, nk, O, dp, d0, alpha, pf);
    d0 = dfull;
  }
  if (d0 < D) {  // a partial last vector
    const int n = D - d0;
    vf acc[RR];
    for (int r = 0; r < RR; ++r) acc[r] = loadu(O + r * dp + d0) * alpha[r];
    for (int j = 0; j < nk; ++j) {
      pf.spend(RR);
      const vf x = load_tail<T>(vr[j] + d0, n);
      for (int r = 0; r < RR; ++r) acc[r] += splat(S[r * kBK + j]) * x;
    }
    for (int r = 0; r < RR; ++r) storeu(O + r * dp + d0, acc[r]);
  }
}

// Rows r0 .. r0+RR-1 against one key tile (nk keys whose K/V rows are kr[] / vr[]).
// pf: the next tile's rows, prefetched as the loops go.
// qsrc: the RR rows of q in the input dtype (unscaled), for the bf16 dot-product path.
template <DType T, int RR>
void small_chunk(const float* __restrict qs, int dp, int D, const E<T>* const* kr,
                 const E<T>* const* vr, int j0, int nk, const Rows& R, int r0, float cap,
                 bool alibi, float* S, float* O, float* m, float* l, RowStream<E<T>>& pf,
                 const E<T>* const* qsrc, float scale) {
  bool done = false;
#if defined(__AVX512F__)
  if constexpr (T == DType::BF16) {
    if (cpu_bf16_dot()) {
      qk_dot_bf16<RR>(qsrc, kr, nk, D, scale, S, pf);
      done = true;
    }
  }
#endif
  if (!done) small_qk<T, RR>(qs, dp, D, kr, nk, r0, S, pf);
  // Transforms, mask and online softmax, vectorised over keys.
  float alpha[RR];
  for (int r = 0; r < RR; ++r) {
    const int row = r0 + r;
    alpha[r] = softmax_row_tile(S + r * kBK, nk, j0, R.lo[row], R.hi[row], R.pos[row], R.slope[row],
                                cap, alibi, false, m[row], l[row]);
    pf.spend(softmax_work(nk));
  }
  small_pv<T, RR>(S, vr, nk, O + r0 * dp, dp, D, alpha, pf);
}

// Rows r0 .. r0+4k of kv head hh's group against one tile, 4 rows per chunk kernel call.
template <DType T>
void small_rows(const float* qs, int dp, int D, const E<T>* const* kh, const E<T>* const* vh,
                int j0, int nk, const Rows& R, int hh, int Mh, const AttnParams& p, bool alibi,
                float* S, float* O, float* m, float* l, RowStream<E<T>>& pf, const E<T>* const* qsrc) {
  for (int c0 = 0; c0 < Mh; c0 += 4) {
    const int r0 = hh * Mh + c0;
    const E<T>* const* qr = qsrc ? qsrc + r0 : nullptr;
    with_chunk_rows(Mh - c0, [&](auto rr) {
      small_chunk<T, decltype(rr)::value>(qs, dp, D, kh, vh, j0, nk, R, r0, p.softcap, alibi, S, O, m, l, pf, qr,
                                          p.softmax_scale);
    });
  }
}

// Quantised caches: each (tile, kv head) pass dequantises its K/V rows into fp32 rows of the
// thread's scratch (one tile, L1-sized; never a copy of the cache) and runs the fp32 chunks.
template <DType T>
void small_quant_tiles(const AttnParams& p, const Task& t, Scratch& sc, const float* qs, int dp,
                       const Rows& R, int Mh, float* S, float* O, float* m, float* l) {
  float* Kf = sc.k.get(size_t(kBK) * dp);
  float* Vf = sc.v.get(size_t(kBK) * dp);
  const float* kr[kBK];
  const float* vr[kBK];
  for (int jj = 0; jj < kBK; ++jj) kr[jj] = Kf + jj * dp, vr[jj] = Vf + jj * dp;
  RowStream<float> none;  // no lines: the rows are converted into the scratch first
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK) {
    const int nk = std::min(kBK, R.khi - j0);
    for (int hh = 0; hh < t.nh; ++hh) {
      for (int jj = 0; jj < nk; ++jj) {
        kv_row_to_f32<T>(p, false, t.b, j0 + jj, t.kvh + hh, Kf + jj * dp);
        kv_row_to_f32<T>(p, true, t.b, j0 + jj, t.kvh + hh, Vf + jj * dp);
      }
      small_rows<DType::F32>(qs, dp, p.head_dim, kr, vr, j0, nk, R, hh, Mh, p,
                             p.alibi_slopes != nullptr, S, O, m, l, none, nullptr);
    }
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
  const E<T>** qsrc = reinterpret_cast<const E<T>**>(sc.t.get(size_t(M) * 2 + 2));
  for (int r = 0; r < M; ++r) {
    qsrc[r] = task_q_row<T>(p, t, G, r);
    row_to_f32<T>(qsrc[r], D, p.softmax_scale, qs + r * dp);
  }
  if (p.kv_quant != KvQuant::None) return small_quant_tiles<T>(p, t, sc, qs, dp, R, Mh, S, O, m, l);
  // Row pointers (head kvh) of the current and the next tile, double-buffered for the prefetch;
  // head kvh + hh is hh * head_stride further.
  const E<T>* rows[2][2][kSmallTile];
  const bool alibi = p.alibi_slopes != nullptr;
  int cur = 0;
  const int n0 = std::min(kSmallTile, R.khi - R.klo);  // keys of the first tile
  tile_rows<T>(p, t.b, t.kvh, R.klo, n0, rows[0][0], rows[0][1]);
  const E<T>* kh[kSmallTile];
  const E<T>* vh[kSmallTile];
  RowStream<E<T>> pf;
  // The first tile has no tile before it to spread its prefetch over: all its rows are requested
  // at once, before its first pass (on Zen 4, fp32 paged decode from memory at 9 / 3 x 64 heads
  // took 5-26% less time, long contexts too).
  pf.start(rows[0][0], rows[0][1], p.k_head_stride, p.v_head_stride, n0, t.nh, D, 1);
  pf.finish();
  for (int j0 = R.klo; j0 < R.khi; j0 += kSmallTile, cur ^= 1) {
    const int nk = std::min(kSmallTile, R.khi - j0);
    const int nn = std::max(0, std::min(kSmallTile, R.khi - j0 - kSmallTile));
    if (nn) tile_rows<T>(p, t.b, t.kvh, j0 + kSmallTile, nn, rows[cur ^ 1][0], rows[cur ^ 1][1]);
    // The next tile's nn x nh rows of K and V, in address order (a key's heads are adjacent in a
    // paged block), spread over all of this tile's work.
    pf.start(rows[cur ^ 1][0], rows[cur ^ 1][1], p.k_head_stride, p.v_head_stride, nn, t.nh, D,
             t.nh * group_work(Mh, nk, D));
    for (int hh = 0; hh < t.nh; ++hh) {
      const int64_t ko = int64_t(hh) * p.k_head_stride, vo = int64_t(hh) * p.v_head_stride;
      for (int jj = 0; jj < nk; ++jj) kh[jj] = rows[cur][0][jj] + ko, vh[jj] = rows[cur][1][jj] + vo;
      small_rows<T>(qs, dp, D, kh, vh, j0, nk, R, hh, Mh, p, alibi, S, O, m, l, pf, qsrc);
    }
    pf.finish();
  }
}

}  // namespace

bool cpu_bf16_dot() {
#if defined(__AVX512F__)
  static const bool v = cpu_avx512_bf16("LLMKERN_ATTN_BF16_DOT");
  return v;
#else
  return false;
#endif
}

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


void attend_small(const AttnParams& p, const Task& t, Scratch& sc) {
  if (attend_decode(p, t, sc)) return;
  switch (p.dtype) {
    case DType::F16: small_impl<DType::F16>(p, t, sc); break;
    case DType::BF16: small_impl<DType::BF16>(p, t, sc); break;
    default: small_impl<DType::F32>(p, t, sc); break;
  }
}

}  // namespace attn
LLMK_NS_END
