// bf16 CPU GEMM on pre-packed weights: out[M, N] (bf16) = x[M, K] W^T + bias, x and W bf16,
// fp32 accumulation, the output rounded to nearest even once at the end.
//
// Weights are packed once, at load time, into the 16-feature panels of gemm_cpu.h with k in pairs:
// panel p holds W[16p + f, 2h + e] at packed[p][h][f][e] (K odd: the last pair's second half zero).
// One 64-byte vector is then 16 features x 2 k, the operand of AVX512_BF16's vdpbf16ps, which adds
// both products of 16 bf16 pairs to 16 fp32 accumulators (32 MACs per instruction, no conversion).
// x is packed per call into gemm_cpu.h's row blocks, one 32-bit word per row per k pair, which the
// tile broadcasts. The row blocks, panel groups, k chunks and threads are gemm_cpu.h's (gemm_units).
//
// The AVX-512 objects are built without -mavx512bf16: the vdpbf16ps tiles carry a target attribute
// and run when the CPU reports the extension (bf16_dot()). Elsewhere the same layout is widened to
// fp32 in registers (a bf16 is the top half of an fp32: even k = word << 16, odd k = word &
// 0xffff0000) and FMA'd, so every build computes the same sums (up to fp32 rounding order).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dispatch.h"
#include "linear/gemm_cpu.h"

LLMK_NS_BEGIN
namespace gemm {

using vec::vu;

constexpr int64_t KC2 = 1024;  // k pairs per chunk: a group of two bf16 panels (128 KB) stays in L2

// True when the vdpbf16ps tiles run: AVX-512 build, the CPU has AVX512_BF16, and
// LLMKERN_LINEAR_BF16_DOT is not 0 (set it to test the widening path on such CPUs).
bool bf16_dot();

LLMK_ALWAYS_INLINE float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// x rows [0, rows) (bf16, row stride ldx) -> k-pair-major words dst[h * xs + i]; odd K pads a zero.
LLMK_ALWAYS_INLINE void pack_x_pairs_block(const uint16_t* x, int64_t ldx, int rows, int64_t K, int xs,
                                           uint32_t* dst) {
  const int64_t kh = K / 2;
  if (ldx % 2 == 0 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {  // a pair is one word of the row
    pack_kmajor(x, ldx / 2, rows, kh, xs, dst);
  } else {
    for (int i = 0; i < rows; ++i)
      for (int64_t h = 0; h < kh; ++h)
        dst[h * xs + i] = uint32_t(x[i * ldx + 2 * h]) | uint32_t(x[i * ldx + 2 * h + 1]) << 16;
  }
  if (K % 2)
    for (int i = 0; i < rows; ++i) dst[kh * xs + i] = x[i * ldx + K - 1];
}

// C[R, P*16] (+)= xb[kc pairs][xs] . W panels (pstride words apart), widened to fp32: every build
// (k pairs in order into one accumulator per output, as in the fp32 tile: acc_tile).
template <int R, int P>
LLMK_ALWAYS_INLINE void tile_bf16_widen(const uint32_t* __restrict xb, int xs, const uint32_t* __restrict w,
                                        int64_t pstride, int64_t kc, float* c, int64_t ldc, bool init,
                                        NextPanels pf) {
  constexpr int V = P * VPP;
  // The even k of every pair first, for all rows, then the odd: each accumulator gets the same two
  // FMAs in the same order as fmadd(ao, wo, fmadd(ae, we, acc)), with V weight vectors live instead
  // of 2V (AVX2's 16 registers then hold the 6 x 2 tile's 12 sums without spilling). x's pair word
  // is broadcast from memory and split in vector registers: a scalar shift, a move and a register
  // broadcast per row and half made the AVX2 tile run at about half its FMA rate.
  acc_tile<R, V>(kc, c, ldc, nullptr, init, [&](vf (&acc)[R][V], int64_t h) __attribute__((always_inline)) {
    pf.at(h, P, pstride);
    const uint32_t* xh = xb + h * xs;
    const auto wvec = [&](int v) {
      vu u;
      std::memcpy(&u, w + (v / VPP) * pstride + h * PW + (v % VPP) * VL, sizeof u);
      return u;
    };
    const auto xword = [&](int i) { return reinterpret_cast<vu>(vec::splat(bits_f32(xh[i]))); };
    vf wh[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) wh[v] = reinterpret_cast<vf>(wvec(v) << 16);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const vf ae = reinterpret_cast<vf>(xword(i) << 16);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = fmadd(ae, wh[v], acc[i][v]);
    }
    // Reload x and W for the odd half: left to itself GCC keeps the first loads' values live
    // across both halves, and the 6 x 2 tile's sums then spill to the stack.
    asm volatile("" ::: "memory");
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) wh[v] = reinterpret_cast<vf>(wvec(v) & 0xffff0000u);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const vf ao = reinterpret_cast<vf>(xword(i) & 0xffff0000u);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = fmadd(ao, wh[v], acc[i][v]);
    }
  });
}

// One instantiation per row count (1 .. MR) keeps each tile's accumulators in registers.
#define LLMK_BF16_ROWS_SWITCH(r, TILE)                                                                     \
  switch (r) {                                                                                             \
    case 1: TILE(1); break; case 2: TILE(2); break; case 3: TILE(3); break; case 4: TILE(4); break;        \
    case 5: TILE(5); break; case 6: TILE(6); break; case 7: TILE(7); break; case 8: TILE(8); break;        \
    case 9: TILE(9); break; case 10: TILE(10); break; case 11: TILE(11); break; case 12: TILE(12); break;  \
    default: break;                                                                                        \
  }

// Rows up to which a widened tile spans two panels: a one- or two-row tile of one panel is VPP chains
// of two dependent FMAs per k pair, which held an AVX2 core (VPP 2) to ~6 bytes of W per cycle
// (batch-1 bf16 decode at ~73% of the weight-read bound); two panels double the chains. Three rows
// would not fit AVX2's 16 registers; the SSE build's panel (VPP 4) has chains enough.
constexpr int kWidenPairRows = VPP <= 2 ? 2 : 0;

// Not inlined: inlined into gemm_units' loop beside the other panel count's tiles, GCC spilled the
// 6 x 2 tile's sums to the stack (bf16 offline throughput fell by a third).
template <int P>
__attribute__((noinline)) void tile_rows_bf16_widen(int r, const uint32_t* xb, int xs, const uint32_t* w,
                                                    int64_t pstride, int64_t kc, float* c, int64_t ldc, bool init,
                                                    NextPanels pf) {
#define LLMK_WIDEN_TILE(R)                                  \
  if constexpr (R <= MR && (P <= NP || R <= kWidenPairRows)) \
  tile_bf16_widen<R, P>(xb, xs, w, pstride, kc, c, ldc, init, pf)
  LLMK_BF16_ROWS_SWITCH(r, LLMK_WIDEN_TILE)
#undef LLMK_WIDEN_TILE
}

#if defined(__AVX512F__)
#define LLMK_BF16_TARGET __attribute__((target("avx512bf16")))

// One k pair of tile_bf16_dot into its accumulators acc (a function, not a lambda, so that it
// carries the target attribute).
template <int R, int P>
LLMK_ALWAYS_INLINE LLMK_BF16_TARGET void dot_step(__m512 (&acc)[R][P], const uint32_t* __restrict xb, int xs,
                                                  const uint32_t* __restrict w, int64_t pstride, int64_t h) {
  __m512bh b[P];
#pragma GCC unroll 4
  for (int j = 0; j < P; ++j) b[j] = (__m512bh)_mm512_loadu_si512(w + j * pstride + h * PW);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xb[h * xs + i]));
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
  }
}

// The same tile with vdpbf16ps: one instruction per 16 features x 2 k per row.
template <int R, int P>
LLMK_ALWAYS_INLINE LLMK_BF16_TARGET void tile_bf16_dot(const uint32_t* __restrict xb, int xs,
                                                       const uint32_t* __restrict w, int64_t pstride, int64_t kc,
                                                       float* c, int64_t ldc, bool init, NextPanels pf) {
  __m512 acc[R][P];  // one per output, k pairs in order (batch invariance: see acc_tile)
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) acc[i][j] = init ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + j * PW);
  for (int64_t h = 0; h < kc; ++h) {
    pf.at(h, P, pstride);
    dot_step<R, P>(acc, xb, xs, w, pstride, h);
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) _mm512_storeu_ps(c + i * ldc + j * PW, acc[i][j]);
}

template <int P>
LLMK_BF16_TARGET void tile_rows_bf16_dot(int r, const uint32_t* xb, int xs, const uint32_t* w, int64_t pstride,
                                         int64_t kc, float* c, int64_t ldc, bool init, NextPanels pf) {
#define LLMK_DOT_TILE(R) tile_bf16_dot<R, P>(xb, xs, w, pstride, kc, c, ldc, init, pf)
  LLMK_BF16_ROWS_SWITCH(r, LLMK_DOT_TILE)
#undef LLMK_DOT_TILE
}
#endif

// r rows of x pairs against np (1 or NP) panels: the vdpbf16ps tiles or the widening ones.
LLMK_ALWAYS_INLINE void tiles_bf16(bool dot, int np, int r, const uint32_t* xb, int xs, const uint32_t* w,
                                   int64_t pstride, int64_t kc, float* c, int64_t ldc, bool init, NextPanels pf) {
#if defined(__AVX512F__)
  if (dot) {
    if (np == 2) tile_rows_bf16_dot<2>(r, xb, xs, w, pstride, kc, c, ldc, init, pf);
    else tile_rows_bf16_dot<1>(r, xb, xs, w, pstride, kc, c, ldc, init, pf);
    return;
  }
#endif
  (void)dot;
  if (np == 2) return tile_rows_bf16_widen<2>(r, xb, xs, w, pstride, kc, c, ldc, init, pf);
  tile_rows_bf16_widen<1>(r, xb, xs, w, pstride, kc, c, ldc, init, pf);
}

// The epilogue of the bf16 GEMMs: fp32 tile rows c (row stride ldc) of `rows` rows against np panels
// from panel p -> bf16 out (row stride ldo, the tile's first row): + bias, or for gated W (gate/up
// panel pairs) silu(gate) * up. kCvt: cpu_bf16_cvt() (vec::store_bf16). O = float: the same bf16
// values written as fp32 (the LM head's logits, widened here instead of by a pass over them).
template <bool kCvt, typename O>
LLMK_ALWAYS_INLINE void store_rows_bf16_as(const float* c, int ldc, int rows, int64_t p, int np, int64_t N,
                                           const uint16_t* bias, bool gated, O* out, int64_t ldo) {
  const int64_t n0 = (gated ? p / 2 : p) * PW;
  const int ncols = int(std::min<int64_t>((gated ? 1 : np) * PW, N - n0));
  O* o = out + n0;
  // Whole vectors explicitly (the compiler vectorised these loops at half width and masked),
  // the last partial panel's columns one by one; both round alike.
  const int nv = ncols / vec::VL * vec::VL;
  for (int row = 0; row < rows; ++row) {
    const float* cr = c + row * ldc;
    O* orow = o + row * ldo;
    for (int j = 0; j < nv; j += vec::VL) {
      vec::vf y = vec::loadu(cr + j);
      if (gated) y = silu_fast(y) * vec::loadu(cr + PW + j);
      else if (bias) y += vec::load<DType::BF16>(bias + n0 + j);
      if constexpr (std::is_same_v<O, float>) vec::storeu(orow + j, vec::round_bf16<kCvt>(y));
      else vec::store_bf16<kCvt>(orow + j, y);
    }
    for (int j = nv; j < ncols; ++j) {
      const float y = gated ? silu_fast(cr[j]) * cr[PW + j] : bias ? cr[j] + vec::bf16_to_f32(bias[n0 + j]) : cr[j];
      if constexpr (std::is_same_v<O, float>) orow[j] = vec::bf16_to_f32(vec::f32_to_bf16(y));
      else orow[j] = vec::f32_to_bf16(y);
    }
  }
}

// store_rows_bf16_as, rounding as cvt (cpu_bf16_cvt()) says.
template <typename O>
LLMK_ALWAYS_INLINE void store_rows_bf16(bool cvt, const float* c, int ldc, int rows, int64_t p, int np, int64_t N,
                                        const uint16_t* bias, bool gated, O* out, int64_t ldo) {
  if (cvt) store_rows_bf16_as<true>(c, ldc, rows, p, np, N, bias, gated, out, ldo);
  else store_rows_bf16_as<false>(c, ldc, rows, p, np, N, bias, gated, out, ldo);
}

// store_rows_bf16 from row row0 of out, or of out32 when set (fp32 rows holding the bf16 results).
LLMK_ALWAYS_INLINE void store_rows_bf16_at(bool cvt, const float* c, int ldc, int rows, int64_t p, int np, int64_t N,
                                           const uint16_t* bias, bool gated, uint16_t* out, float* out32,
                                           int64_t row0, int64_t ldo) {
  if (out32) store_rows_bf16(cvt, c, ldc, rows, p, np, N, bias, gated, out32 + row0 * ldo, ldo);
  else store_rows_bf16(cvt, c, ldc, rows, p, np, N, bias, gated, out + row0 * ldo, ldo);
}

// Words of x-pair scratch gemm_bf16 needs for M rows of K.
inline int64_t xpack_pairs_words(int64_t M, int64_t K) { return (M + MR - 1) / MR * MR * ((K + 1) / 2); }

// The bf16 GEMMs: x [M, K] (row stride ldx) against W packed in pairs ([npanels][ceil(K/2)][16][2]).
// gated = false: out [M, N] = x W^T + bias. gated = true: W holds gate/up panel pairs interleaved
// (pack_gate_up_weight's order) and out [M, N] = silu(x Wg^T) * (x Wu^T).
// xpack: scratch of xpack_pairs_words(M, K) words. out32 (when set, in place of out): the rows as fp32
// holding the bf16 results.
inline void gemm_bf16(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                      const uint16_t* bias, bool gated, uint16_t* out, int64_t ldo, uint32_t* xpack,
                      float* out32 = nullptr) {
  const RowBlocks blk(M);
  const int xs = blk.n == 1 ? int(M) : MR;
  const int64_t KH = (K + 1) / 2;
  const auto pack = [&](int64_t b) {
    pack_x_pairs_block(x + blk.start(b) * ldx, ldx, blk.rows(b), K, xs, xpack + b * MR * KH);
  };
  const RowPacker<decltype(pack)> rows(blk, M * K, pack);
  // As gemm_packed: up to kStreamRows rows the GEMM is bound by reading W, one panel per tile keeps
  // each thread's reads one sequential stream; but the widened tiles of one or two rows take two
  // panels (kWidenPairRows: one panel's FMA chains cannot keep up with memory). Every output sums its
  // k pairs in the same order either way.
  const bool dot = bf16_dot(), cvt = ::llmk::cpu_bf16_cvt();
  const int gw = M <= kStreamRows ? (!dot && M <= kWidenPairRows ? 2 : 1) : NP;
  const int unit = gated ? 2 : gw;
  const int64_t npanels = (gated ? 2 : 1) * num_panels(N), pstride = KH * PW;
  const int64_t kh1 = std::max<int64_t>(KH, 1);  // K = 0 (an empty sum) still writes the epilogue
  const int64_t grain = task_grain(kh1 * PW * 4 * unit, 2 * M * kh1 * 2 * PW * unit);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(packed);
  auto tiles = [&](int r, int64_t b, int64_t p, int np, int64_t h0, int64_t kc, float* c, int ldc, bool init,
                   NextPanels pf) {
    tiles_bf16(dot, np, r, xpack + b * MR * KH + h0 * xs, xs, w + p * pstride + h0 * PW, pstride, kc, c, ldc, init,
               pf);
  };
  auto store = [&](int64_t b, int64_t p, int np, const float* c, int ldc) {
    store_rows_bf16_at(cvt, c, ldc, blk.rows(b), p, np, N, bias, gated, out, out32, blk.start(b), ldo);
  };
  // the next unit's prefetch: not for the one-panel tiles of AVX512_BF16 decode rows (one stream)
  // unless cpu_bf16_gemv_prefetch (Intel); the widening tiles keep it (on AVX2 without it: the
  // gate/up GEMV of one row ~7-10% slower, four rows of a plain one up to ~15%)
  const bool pf_next = gw >= NP || (dot && ::llmk::cpu_bf16_gemv_prefetch());
  gemm_units(blk, npanels, unit, gw, pf_next, KH, KC2, grain, KH * 4, w, pstride, rows, tiles, store);
}

}  // namespace gemm
LLMK_NS_END
