// CPU GEMM on pre-packed weights: out[M, N] = x[M, K] W^T + bias, fp32 accumulation.
//
// Weights are packed once, at load time, into panels of 16 output features laid out k-major:
// panel p holds W[16p .. 16p+15, k] at packed[p][k][0..15] (the last panel zero-padded). A panel is
// then one contiguous stream, and each k step of the micro-kernel is whole-vector loads of W and
// broadcasts of x: the register tile is MR rows of x by NP panels (AVX-512: 12 x 32, i.e. 24
// accumulators of the 32 zmm registers; AVX2: 6 x 16; SSE: 2 x 16).
//
// x is packed per call into blocks of MR rows, k-major (xp[b][k][0..MR-1]), so a tile's broadcasts
// come from one stream with constant offsets. A work item (for_gemm_items) is a range of panels
// against a row super-block of about kXBlockBytes of x, and walks, for each panel group, every row
// block of it: the panels stay in L2 while x streams past them, so W is read from memory once per
// call for a decode step (M = 1 .. 64, one super-block). For prefill, x stays in L2 while its
// super-block is swept, and W is re-read (from L3, or L2 when the thread's range fits) once per
// super-block, instead of all of x coming from L3 for every panel range.
// Measured on a 2-core Zen 4: ~2x torch's (MKL) sgemm at 8-64 rows, ~1.5x at 1024.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/exp_cpu.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"

LLMK_NS_BEGIN
namespace gemm {

using vec::vf;
using vec::VL;

constexpr int PW = 16;         // panel width (output features), fixed so packing is ISA-independent
constexpr int VPP = PW / VL;   // vectors per panel
#if defined(__AVX512F__)
constexpr int NP = 2, MR = 12;
#elif defined(__AVX2__)
constexpr int NP = 1, MR = 6;
#else
constexpr int NP = 1, MR = 2;
#endif
static_assert(MR <= 12, "tile_rows instantiates tiles of 1 .. 12 rows");
constexpr int64_t KC = 2048;   // k chunk: a group of NP panels (KC x 128 B) stays in L2
// A tile of >= 3 rows prefetches its W this many k steps ahead into L1. W comes from L2 (a group of
// 2 panels at K = 576 is 72 KB, over L1), and without it the loads stalled: the 12 x 32 tile swept
// by a super-block ran at ~165 GFLOP/s per core on the Xeon, ~176 with it (distances 8-24 alike).
constexpr int kWPrefetchSteps = 16, kWPrefetchRows = 3;
constexpr int64_t kXBlockBytes = 512 << 10;  // x per row super-block: half of the smaller L2s (Zen 4: 1 MB)
// Up to this many rows a GEMM is bound by reading W, and each thread reads fp32 W fastest as one
// sequential stream: one panel group after the other, without the next group's prefetch (that
// second stream, 36 KB ahead at K = 576, cost a Zen 2 core ~20% of its fp32 GEMV rate). The bf16
// tiles widen W in registers, do more per line, and keep the prefetch.
constexpr int64_t kStreamRows = 4;

// Units of `unit_bytes` of x (>= 1) per row super-block.
inline int64_t units_per_x_block(int64_t unit_bytes) {
  return std::max<int64_t>(1, kXBlockBytes / std::max<int64_t>(1, unit_bytes));
}

LLMK_ALWAYS_INLINE vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

inline int64_t num_panels(int64_t n) { return (n + PW - 1) / PW; }

// Rows [0, rows) of kw 32-bit words (row stride ldx words) -> one k-major block dst[k * xs + i],
// xs >= rows (rows beyond `rows` are never read; they may be written). fp32 x, or bf16 x read as
// k pairs. On AVX-512 16 words of up to 16 rows at a time, transposed in registers: the element
// loop ran at ~1 ns per value and was 6% of an fp32 decode step at 48 rows.
LLMK_ALWAYS_INLINE void pack_kmajor(const void* x, int64_t ldx, int rows, int64_t kw, int xs, void* dst) {
  const char* src = static_cast<const char*>(x);
  char* d = static_cast<char*>(dst);
  if (xs == 1) {  // one row: k-major is the row itself
    if (rows == 1) std::memcpy(d, src, size_t(kw) * 4);
    return;
  }
  int64_t k = 0;
#if defined(__AVX512F__)
  if (xs <= 16) {
    const __mmask16 lanes = __mmask16((1u << xs) - 1);
    for (; k + 16 <= kw; k += 16) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = i < rows ? _mm512_loadu_si512(src + (i * ldx + k) * 4) : _mm512_setzero_si512();
      vec::transpose16_epi32(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(d + (k + j) * xs * 4, lanes, r[j]);
    }
  }
#endif
  for (int i = 0; i < rows; ++i)
    for (int64_t kk = k; kk < kw; ++kk) std::memcpy(d + (kk * xs + i) * 4, src + (i * ldx + kk) * 4, 4);
}

// The frame of an R x V-vector tile: the accumulators start from c, or on the first k chunk (init)
// from bias (or 0); step(acc, k) adds k = 0 .. kc-1 in order; the result is stored back to c (row
// stride ldc). One accumulator per output and k in order, whatever R: a row's sums do not depend on
// how many rows share its tile, so a row gives the same bits whatever it is batched with (batch
// invariance). (Splitting k over several accumulator sets in thin tiles hid the FMA latency of a
// 1-2 row tile but made a decode row's bits depend on the batch size; such a tile still streams W
// faster than DRAM delivers it: one 64-byte line per FMA latency.)
template <int R, int V, typename Step>
LLMK_ALWAYS_INLINE void acc_tile(int64_t kc, float* c, int64_t ldc, const float* bias, bool init, const Step& step) {
  vf acc[R][V];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v)
      acc[i][v] = init ? (bias ? vec::loadu(bias + v * VL) : vec::splat(0.f)) : vec::loadu(c + i * ldc + v * VL);
  for (int64_t k = 0; k < kc; ++k) step(acc, k);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) vec::storeu(c + i * ldc + v * VL, acc[i][v]);
}

// The next panel group's W, read into L2 while the row blocks of a super-block sweep the current
// group, so that the read from memory overlaps their arithmetic. A k step of a panel is one 64-byte
// line (16 fp32, or 16 bf16 pairs). With n row blocks the lines are split between the first 2^s <=
// n of them (s <= 4): block i prefetches every 2^s-th k step, a slice 1/2^s of the group. Issuing
// the whole group from one block (n = 1: a decode step's 1-12 rows) leaves nothing to hide it
// behind at a few row blocks; spread, a decode step's W arrives while the others compute.
struct NextPanels {
  const char* p = nullptr;  // this block's slice of the next group (panel 0, k offset applied)
  int shift = 0;
  LLMK_ALWAYS_INLINE void at(int64_t k, int P, int64_t pstride) const {
    if (p && !(k & ((int64_t(1) << shift) - 1)))
#pragma GCC unroll 4
      for (int j = 0; j < P; ++j) __builtin_prefetch(p + (j * pstride + (k >> shift) * PW) * 4, 0, 2);
  }
};

// Row block i of the n sweeping a group: its slice of `next` (4-byte words, panel 0 at the chunk's
// first k step) over kc k steps; none when next is null or i is past the blocks that share it.
inline NextPanels next_panels(const void* next, int64_t i, int64_t n, int64_t kc) {
  if (!next) return {};
  int s = 0;
  while (s < 4 && (int64_t(2) << s) <= n) ++s;
  if (i >= (int64_t(1) << s)) return {};
  const int64_t lines = (kc + (int64_t(1) << s) - 1) >> s;
  return {static_cast<const char*>(next) + i * lines * PW * 4, s};
}

// C[R, P*16] (+)= xb[kc][xs] . W panels; `w` points at panel 0 (k offset applied), panels `pstride`
// floats apart. c has row stride ldc; init (first k chunk) starts from bias (or 0), else from c.
// pf: this block's slice of the next group (NextPanels).
template <int R, int P>
LLMK_ALWAYS_INLINE void tile(const float* __restrict xb, int xs, const float* __restrict w, int64_t pstride,
                             int64_t kc, float* c, int64_t ldc, const float* bias, bool init,
                             NextPanels pf) {
  constexpr int V = P * VPP;
  const float* wv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) wv[v] = w + (v / VPP) * pstride + (v % VPP) * VL;
  acc_tile<R, V>(kc, c, ldc, bias, init, [&](vf (&acc)[R][V], int64_t k) __attribute__((always_inline)) {
    pf.at(k, P, pstride);
    if (R >= kWPrefetchRows)
#pragma GCC unroll 4
      for (int j = 0; j < P; ++j) __builtin_prefetch(wv[j * VPP] + (k + kWPrefetchSteps) * PW, 0, 3);
    vf b[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) b[v] = vec::loadu(wv[v] + k * PW);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const vf a = vec::splat(xb[k * xs + i]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = fmadd(a, b[v], acc[i][v]);
    }
  });
}

template <int P>
LLMK_ALWAYS_INLINE void tile_rows(int r, const float* xb, int xs, const float* w, int64_t pstride, int64_t kc,
                                  float* c, int64_t ldc, const float* bias, bool init, NextPanels pf) {
  switch (r) {  // one instantiation per row count keeps every tile's accumulators in registers
#define LLMK_TILE_CASE(R) \
  case R:                 \
    if constexpr (R <= MR) tile<R, P>(xb, xs, w, pstride, kc, c, ldc, bias, init, pf); \
    break;
    LLMK_TILE_CASE(1) LLMK_TILE_CASE(2) LLMK_TILE_CASE(3) LLMK_TILE_CASE(4) LLMK_TILE_CASE(5)
    LLMK_TILE_CASE(6) LLMK_TILE_CASE(7) LLMK_TILE_CASE(8) LLMK_TILE_CASE(9) LLMK_TILE_CASE(10)
    LLMK_TILE_CASE(11) LLMK_TILE_CASE(12)
#undef LLMK_TILE_CASE
    default: break;
  }
}

// Row block b of M rows split into ceil(M / MR) blocks of near-equal size (32 rows on AVX-512: 11 +
// 11 + 10 rather than 12 + 12 + 8, so no block runs a thin, load-bound tile).
struct RowBlocks {
  int64_t n, base, extra;
  explicit RowBlocks(int64_t M) : n((M + MR - 1) / MR), base(M / n), extra(M % n) {}
  int64_t start(int64_t b) const { return b * base + std::min(b, extra); }
  int rows(int64_t b) const { return int(base + (b < extra)); }
  // Row blocks per super-block, for x rows of row_bytes each.
  int64_t super_blocks(int64_t row_bytes) const { return units_per_x_block(MR * row_bytes); }
};

// x's row blocks, packed up front on the calling thread when x is small (a decode step's: a pass
// on two threads costs more than it saves), else each by the first work item that reads it (ready()):
// a separate parallel pass wrote a prefill's packed x out to L3 and every super-block read it back,
// ~5% of a 2048-row GEMM; packed by its reader, a super-block's x is still in L2 for the sweep.
template <typename PackBlock>
class RowPacker {
 public:
  RowPacker(const RowBlocks& blk, int64_t x_elems, const PackBlock& pack) : pack_(pack) {
    if (x_elems < (1 << 18) || max_threads() <= 1) {
      for (int64_t b = 0; b < blk.n; ++b) pack_(b);
      return;
    }
    state_.reset(new std::atomic<uint8_t>[size_t(blk.n)]);
    for (int64_t b = 0; b < blk.n; ++b) state_[b].store(kIdle, std::memory_order_relaxed);
  }
  // Blocks [b0, b1) packed, for the work item of units [u0, ..) of nunits: claims and packs those no
  // thread has, starting u0 / nunits of the way in (items sharing a super-block start apart, so they
  // pack it together), then waits for the rest, which their claimers are packing.
  void ready(int64_t b0, int64_t b1, int64_t u0, int64_t nunits) const {
    if (!state_) return;
    const int64_t n = b1 - b0, first = b0 + u0 * n / nunits;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = b0 + (first - b0 + i) % n;
      uint8_t idle = kIdle;
      if (state_[b].load(std::memory_order_relaxed) == kIdle &&
          state_[b].compare_exchange_strong(idle, kPacking, std::memory_order_acquire)) {
        pack_(b);
        state_[b].store(kPacked, std::memory_order_release);
      }
    }
    for (int64_t b = b0; b < b1; ++b) ::llmk::wait_until_equal(state_[b], kPacked);
  }

 private:
  static constexpr uint8_t kIdle = 0, kPacking = 1, kPacked = 2;
  const PackBlock& pack_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // null: all packed up front
};

// fp32 x's row block b -> its k-major block of xpack (MR * K floats per block): RowPacker's packing.
inline auto kmajor_blocks(const float* x, int64_t ldx, int64_t K, const RowBlocks& blk, int xs, float* xpack) {
  return [=, &blk](int64_t b) { pack_kmajor(x + blk.start(b) * ldx, ldx, blk.rows(b), K, xs, xpack + b * MR * K); };
}

// Pool tasks of >= ~5 us (>= 100 KB of W to read or >= 0.5 MFLOP) hide its wake-up cost.
LLMK_ALWAYS_INLINE int64_t task_grain(int64_t unit_bytes, int64_t unit_flops) {
  return std::max<int64_t>(1, std::min((100000 + unit_bytes - 1) / unit_bytes, (500000 + unit_flops - 1) / unit_flops));
}

// The GEMMs' work, f(s, u0, u1): row super-block s (of nsuper) against units [u0, u1) (panel groups,
// or the epilogue driver's units). Items run super-block-major, one per pool claim, and the units
// are cut into as few ranges as keep every thread busy (>= kChunksPerThread items per thread, each
// range >= grain units). A range of units sweeping every super-block re-read all of x (a prefill's
// MBs, from L3) per range: with 4 ranges per thread, 2-thread fp32 GEMMs at 2048 rows ran at 1.64x
// one thread's rate; now each thread's x traffic is one pass while its W range stays in L2.
template <typename F>
LLMK_ALWAYS_INLINE void for_gemm_items(int64_t nsuper, int64_t nunits, int64_t grain, const F& f) {
  const int64_t nt = max_threads();
  if (nunits <= 0 || nsuper <= 0) return;
  int64_t ranges = std::max<int64_t>(nt, (nt * kChunksPerThread + nsuper - 1) / nsuper);
  ranges = std::max<int64_t>(1, std::min(ranges, (nunits + grain - 1) / grain));
  const int64_t per = (nunits + ranges - 1) / ranges;
  ranges = (nunits + per - 1) / per;
  // One item per pool claim; in order on the calling thread when single-threaded or nested.
  parallel_for_dynamic(nsuper * ranges, [&](int64_t i) {
    const int64_t s = i / ranges, u0 = i % ranges * per;
    f(s, u0, std::min(nunits, u0 + per));
  });
}

// out [M, N] (row stride ldo) = x [M, K] (row stride ldx) W^T + bias, W as packed panels
// [num_panels(N)][K][16]. xpack: scratch of >= ceil(M / MR) * MR * K floats.
// x blocks are packed with stride MR, or M when one block holds every row: a decode step's one
// row then streams 4 bytes per k, not a 48-byte stride that spills L1 for long K.
inline void gemm_packed(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed, int64_t N,
                        const float* bias, float* out, int64_t ldo, float* xpack) {
  const RowBlocks blk(M);
  const int xs = blk.n == 1 ? int(M) : MR;
  const auto pack = kmajor_blocks(x, ldx, K, blk, xs, xpack);
  const RowPacker<decltype(pack)> rows(blk, M * K, pack);
  // A group is the NP panels one tile spans. Up to kStreamRows rows one panel at a time keeps each
  // thread's reads a single sequential stream (the GEMV measured interleaved weight-row streams
  // ~30% below the read bandwidth).
  const bool stream = M <= kStreamRows;
  const int gw = stream ? 1 : NP;
  const int64_t npanels = num_panels(N), ngroups = (npanels + gw - 1) / gw;
  const int64_t pstride = K * PW;
  const int64_t grain = task_grain(K * PW * gw * 4, 2 * M * K * PW * gw);
  const int64_t sb = blk.super_blocks(K * 4);
  for_gemm_items((blk.n + sb - 1) / sb, ngroups, grain, [&](int64_t si, int64_t g0, int64_t g1) {
    float cbuf[MR * NP * PW], bbuf[NP * PW];
    const int64_t s0 = si * sb, s1 = std::min(blk.n, s0 + sb);
    rows.ready(s0, s1, g0, ngroups);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min(KC, K - k0);
      const bool init = k0 == 0;
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t p = g * gw, n0 = p * PW;
        const int np = int(std::min<int64_t>(gw, npanels - p));
        const int ncols = int(std::min<int64_t>(np * PW, N - n0));
        const bool edge = ncols < np * PW;  // last panel of an N that is not a multiple of 16
        const float* bp = nullptr;
        if (bias && init) {
          bp = bias + n0;
          if (edge) {
            std::fill(bbuf, bbuf + NP * PW, 0.f);
            std::copy(bias + n0, bias + n0 + ncols, bbuf);
            bp = bbuf;
          }
        }
        const float* wg = packed + p * pstride + k0 * PW;
        for (int64_t b = s0; b < s1; ++b) {
          const int64_t m0 = blk.start(b);
          const int r = blk.rows(b);
          const float* xb = xpack + b * MR * K + k0 * xs;
          float* c = out + m0 * ldo + n0;
          int64_t ldc = ldo;
          if (edge) {  // through a local tile, so only the valid columns are touched
            c = cbuf;
            ldc = NP * PW;
            if (!init)
              for (int i = 0; i < r; ++i) std::copy_n(out + (m0 + i) * ldo + n0, ncols, cbuf + i * ldc);
          }
          // The next group of this item streams in meanwhile (after its last, the first again
          // for the next k chunk). Not up to kStreamRows rows: one sequential stream reads faster.
          // Only in the first super-block: the later ones find W in L3, where the hardware
          // prefetcher keeps up and the extra requests only held the fill buffers (2048 rows:
          // ~5% slower).
          const float* next = stream ? nullptr
                              : g + 1 < g1 ? wg + gw * pstride
                              : k0 + kc < K ? packed + g0 * gw * pstride + (k0 + kc) * PW : nullptr;
          const NextPanels pf = next_panels(si == 0 ? next : nullptr, b - s0, s1 - s0, kc);
          if (np == NP) tile_rows<NP>(r, xb, xs, wg, pstride, kc, c, ldc, bp, init, pf);
          else tile_rows<1>(r, xb, xs, wg, pstride, kc, c, ldc, bp, init, pf);
          if (edge)
            for (int i = 0; i < r; ++i) std::copy_n(cbuf + i * ldc, ncols, out + (m0 + i) * ldo + n0);
        }
      }
    }
  });
}

// The driver of the GEMMs whose output goes through an epilogue (the gated SiLU, bf16 rounding):
// the npanels output panels are split into units of `unit` panels (a gate/up pair, or one tile's
// panel group), work items are ranges of units against a row super-block (for_gemm_items), and
// for each unit and row block an item accumulates
// every k chunk in a local fp32 tile c (row stride unit * PW) before epi(b, p, np, c, ldc) writes
// the output. rows (a RowPacker) packs x's row blocks before an item reads them. tiles(r, b, p, np,
// k0, kc, c, ldc, init, pf) computes row block b (r rows) against np <= gw panels from panel p over
// k steps [k0, k0 + kc) into c, prefetching pf (NextPanels: the next unit's panels when
// prefetch_next). W stays
// in L1/L2 while the row blocks of a super-block (x_row_bytes per row: see gemm_packed) stream past
// it. w: the packed panels, pstride 4-byte words apart (a k step of a panel is one 64-byte line).
template <typename Rows, typename Tiles, typename Epi>
LLMK_ALWAYS_INLINE void gemm_units(const RowBlocks& blk, int64_t npanels, int unit, int gw, bool prefetch_next,
                                   int64_t ksteps, int64_t kchunk, int64_t grain, int64_t x_row_bytes, const void* w,
                                   int64_t pstride, const Rows& rows, const Tiles& tiles, const Epi& epi) {
  const int64_t nunits = (npanels + unit - 1) / unit, sb = blk.super_blocks(x_row_bytes);
  const char* wb = static_cast<const char*>(w);
  for_gemm_items((blk.n + sb - 1) / sb, nunits, grain, [&](int64_t si, int64_t u0, int64_t u1) {
    alignas(64) float c[MR * 2 * PW];
    const int ldc = unit * PW;
    const int64_t s0 = si * sb, s1 = std::min(blk.n, s0 + sb);
    rows.ready(s0, s1, u0, nunits);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t p = u * unit;
      const int np = int(std::min<int64_t>(unit, npanels - p));
      // As gemm_packed: with prefetch_next, the item's next unit streams in (first super-block),
      // each of a unit's tiles prefetching the same panels of it (AVX2's gate/up pair is two
      // one-panel tiles).
      const bool pre = prefetch_next && u + 1 < u1 && si == 0;
      const int next_np = pre ? int(std::min<int64_t>(unit, npanels - (u + 1) * unit)) : 0;
      for (int64_t b = s0; b < s1; ++b) {
        const int r = blk.rows(b);
        int64_t k0 = 0;
        do {  // at least once: with no k steps the tiles start c at 0 (an empty sum)
          const int64_t kc = std::min(kchunk, ksteps - k0);
          for (int j = 0; j < np; j += gw) {
            const NextPanels pf =
                next_panels(j < next_np ? wb + (((u + 1) * unit + j) * pstride + k0 * PW) * 4 : nullptr, b - s0,
                            s1 - s0, kc);
            tiles(r, b, p + j, std::min(gw, np - j), k0, kc, c + j * PW, ldc, k0 == 0, pf);
          }
          k0 += kchunk;
        } while (k0 < ksteps);
        epi(b, p, np, c, ldc);
      }
    }
  });
}

// out [M, N] (row stride ldo) = silu(x Wg^T) * (x Wu^T): the MLP's gate/up projection with the gated
// SiLU as the epilogue, so the [M, 2N] intermediate is never written. `pairs` holds the packed gate
// and up panels interleaved ([2 * num_panels(N)][K][16], gate panel i at 2i, up panel i at 2i + 1).
// Every column is computed by the tile shape gemm_packed gives the concatenated [Wg; Wu] at this M
// (gw panels per tile, the same row blocks and k chunks), and the epilogue is silu_and_mul's
// arithmetic, so the result is bit-identical to gemm_packed followed by silu_and_mul whenever N is
// a multiple of 16 (otherwise the unfused path's panels straddle gate and up: last-bit
// differences).
inline void gemm_packed_silu_mul(const float* x, int64_t ldx, int64_t M, int64_t K, const float* pairs, int64_t N,
                                 float* out, int64_t ldo, float* xpack) {
  const RowBlocks blk(M);
  const int xs = blk.n == 1 ? int(M) : MR;
  const auto pack = kmajor_blocks(x, ldx, K, blk, xs, xpack);
  const RowPacker<decltype(pack)> rows(blk, M * K, pack);
  const bool stream = M <= kStreamRows;  // as gemm_packed
  const int gw = stream ? 1 : NP;
  const int64_t pstride = K * PW;
  const int64_t grain = task_grain(2 * K * PW * 4, 4 * M * K * PW);
  auto tiles = [&](int r, int64_t b, int64_t p, int np, int64_t k0, int64_t kc, float* c, int ldc, bool init,
                   NextPanels pf) {
    const float* xb = xpack + b * MR * K + k0 * xs;
    const float* w = pairs + p * pstride + k0 * PW;
    if constexpr (NP == 2)
      if (np == 2) return tile_rows<2>(r, xb, xs, w, pstride, kc, c, ldc, nullptr, init, pf);
    tile_rows<1>(r, xb, xs, w, pstride, kc, c, ldc, nullptr, init, pf);
  };
  auto silu_mul = [&](int64_t b, int64_t p, int, const float* c, int ldc) {
    float* o = out + blk.start(b) * ldo + p / 2 * PW;
    const int ncols = int(std::min<int64_t>(PW, N - p / 2 * PW));
    // (in whole vectors: the element loop GCC left scalar was a fifth of the fused GEMM's time at
    // 48-512 rows on AVX2)
    for (int row = 0; row < blk.rows(b); ++row)
      silu_mul_row<DType::F32>(c + row * ldc, c + row * ldc + PW, o + row * ldo, ncols);
  };
  gemm_units(blk, 2 * num_panels(N), 2, gw, !stream, K, KC, grain, K * 4, pairs, pstride, rows, tiles, silu_mul);
}

}  // namespace gemm
LLMK_NS_END
