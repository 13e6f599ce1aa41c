// The MoE experts' bf16 GEMMs over weights as fused_moe receives them ([N, K] row-major) where the
// AMX tiles do not run them (moe_amx_cpu.h): each thread takes units of 32 weight rows (two 16-row
// panels; gated: gate panel i with up panel i), transposes them into the packed GEMM's k-pair layout
// as it reads them (a decode expert's 64 k pairs at a time, into L1; with more token rows the whole
// unit, into L2), and runs the packed bf16 GEMM's tiles (vdpbf16ps, or widened to fp32 FMAs) and
// epilogue on them. Every output is the packed experts' sum in the same order, so plain and packed
// experts give the same bits, and each weight is read once a call. (Before, these experts went
// through the fp32 pipeline: x and every weight widened, fp32 FMAs; on Zen 4 that ran at 0.38-0.46x
// of the HF expert loop at 64 and 512 tokens.)
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/aligned_vector.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "linear/gemm_bf16_cpu.h"
#include "moe/moe_math.h"

LLMK_NS_BEGIN
namespace moe_bf16 {

constexpr int64_t kStep = gemm::PW;  // k pairs per transposed block: 16 x 16 pair words
// k pairs a decode unit packs and computes at a time (see gemm_stored): on Zen 4 a token's two
// experts (1024 x 2816) took 0.78-0.90 ms at 64, 0.98-1.41 at 16, 1.00-1.15 at 32, 0.81-0.87 at 128
// and 0.95-0.97 at 256 (two to four runs each, the same hour).
constexpr int64_t kDecodeChunk = 64;

// Pairs [h0, h0 + hs) of rows [n0, n0 + 16) of W [*, K] bf16 (rows at or past nend zero) -> k-pair
// panel rows dst[h - h0][16]: word (h, f) = W[n0 + f][2h, 2h + 1], an odd K's last word with a zero
// high half. 16 pairs at a time, each block's 16 x 16 words transposed in registers; block h / 16
// prefetches lines [h, h + 16) of next (next_lines lines: the next unit's run, see gemm_stored),
// one beside each row's load.
inline void pack_pairs(const uint16_t* W, int64_t K, int64_t n0, int64_t nend, int64_t h0, int64_t hs,
                       uint32_t* dst, const char* next, int64_t next_lines) {
  constexpr int PW = gemm::PW;
  const int rows = int(std::clamp<int64_t>(nend - n0, 0, PW));
  const uint16_t* w0 = W + n0 * K;
  for (int64_t h = h0; h < h0 + hs; h += kStep) {
    const int64_t n = std::min(kStep, h0 + hs - h);
    uint32_t* d = dst + (h - h0) * PW;
    const int pf = next ? int(std::clamp<int64_t>(next_lines - h, 0, PW)) : 0;
    const char* pl = pf ? next + h * 64 : nullptr;
#if defined(__AVX512F__)
    if (n == kStep && 2 * (h + n) <= K) {
      __m512i r[PW];
      for (int f = 0; f < PW; ++f) {
        if (f < pf) __builtin_prefetch(pl + f * 64, 0, 2);
        r[f] = f < rows ? _mm512_loadu_si512(w0 + f * K + 2 * h) : _mm512_setzero_si512();
      }
      vec::transpose16_epi32(r);
      for (int i = 0; i < PW; ++i) _mm512_store_si512(d + i * PW, r[i]);
      continue;
    }
#endif
    for (int l = 0; l < pf; ++l) __builtin_prefetch(pl + l * 64, 0, 2);
    for (int64_t i = 0; i < n; ++i)
      for (int f = 0; f < PW; ++f) {
        const uint16_t* wr = w0 + f * K + 2 * (h + i);
        d[i * PW + f] = f >= rows ? 0u : uint32_t(wr[0]) | (2 * (h + i) + 1 < K ? uint32_t(wr[1]) << 16 : 0u);
      }
  }
}

// out [M, n] (row stride ldo) = x [M, K] (bf16, row stride K) W^T with W [N, K] bf16 as stored;
// gated: N = 2 I (gate rows [0, I), up rows [I, 2 I)) and out [M, I] = silu(x Wg^T) * (x Wu^T), the
// activations rounded to bf16 (gemm_bf16's epilogue).
// With one row block (decode: up to 12 tokens an expert) a unit's k pairs go by in chunks of
// kDecodeChunk: each chunk is transposed into an L1 buffer and the tile runs over it at once, its
// sums parked in fp32 between chunks (exact: the same sums as one pass). Packing a whole unit first
// and then running the tile left the tile's dependent vdpbf16ps chains unoverlapped with the read
// of W: such experts decoded at half the packed experts' rate. With more row blocks the whole unit
// is packed first (into L2) and every row block's tile runs over all of k. Either way the 16 rows a
// block reads are 16 streams the hardware prefetchers do not follow: the next unit's two runs of
// rows (each contiguous) are prefetched in address order, 16 lines a block (without, half the
// rate again).
inline void gemm_stored(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, bool gated,
                        uint16_t* out, int64_t ldo) {
  using namespace gemm;
  const RowBlocks blk(M);
  const int xs = blk.n == 1 ? int(M) : MR;
  const int64_t KH = (K + 1) / 2, outs = gated ? N / 2 : N;
  thread_local std::vector<uint32_t> xpack;
  xpack.resize(size_t(xpack_pairs_words(M, K)));
  for (int64_t b = 0; b < blk.n; ++b)
    pack_x_pairs_block(x + blk.start(b) * K, K, blk.rows(b), K, xs, xpack.data() + b * MR * KH);
  const uint32_t* xp = xpack.data();  // the calling thread's (a thread_local named in the workers is theirs)
  const bool dot = bf16_dot(), cvt = ::llmk::cpu_bf16_cvt();
  // Tiles NP panels wide with vdpbf16ps (a decode row's gate and up sums: two dependent chains in
  // one loop; a token's two experts took 0.91 ms against 1.24 with two one-panel tiles, one run
  // each); the widening tiles as gemm_bf16 takes them (AVX2's registers). Any width, the same sums.
  const int gw = dot ? NP : M <= kStreamRows ? (M <= kWidenPairRows ? 2 : 1) : NP;
  constexpr int unit = 2;
  const int64_t npanels = (gated ? 2 : 1) * num_panels(outs), nunits = (npanels + unit - 1) / unit;
  const int64_t grain = task_grain(KH * PW * 4 * unit, 2 * M * KH * 2 * PW * unit);
  const int64_t chunk = std::max<int64_t>(1, blk.n == 1 ? std::min(kDecodeChunk, KH) : KH);
  parallel_for(nunits, grain, [&](int64_t u0, int64_t u1) {
    thread_local ::llmk::aligned_vector<uint32_t> wbuf;  // the unit's two k-pair panels, `chunk` pairs of each
    wbuf.resize(size_t(unit * chunk * PW));
    uint32_t* wb = wbuf.data();
    thread_local std::vector<float> cs;  // the row blocks' sums, MR x 2 panels each
    cs.resize(size_t(blk.n * MR * unit * PW));
    const int ldc = unit * PW;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t p = u * unit;
      const int np = int(std::min<int64_t>(unit, npanels - p));
      // panel j of unit v: its first weight row and the end of its matrix (gated: j 0 gate, 1 up)
      const auto first = [&](int64_t v, int j) { return moe::stored_unit_row(gated, outs, v, j); };
      const auto end = [&](int j) { return gated ? (j + 1) * outs : N; };
      // the next unit's two runs of up to 16 rows, each contiguous
      const char* nx[unit] = {};
      int64_t nlines[unit] = {};
      if (u + 1 < u1)
        for (int j = 0; j < unit; ++j) {
          const int64_t n = first(u + 1, j);
          if (n >= end(j)) continue;
          nx[j] = reinterpret_cast<const char*>(w + n * K);
          nlines[j] = (std::min<int64_t>(PW, end(j) - n) * K * 2 + 63) / 64;
        }
      int64_t h0 = 0;
      do {  // at least once: with no k pairs the tiles start at 0 (an empty sum)
        const int64_t hs = std::min(chunk, KH - h0);
        for (int j = 0; j < np; ++j) pack_pairs(w, K, first(u, j), end(j), h0, hs, wb + j * chunk * PW, nx[j], nlines[j]);
        for (int64_t b = 0; b < blk.n; ++b)
          for (int j = 0; j < np; j += gw)
            tiles_bf16(dot, std::min(gw, np - j), blk.rows(b), xp + b * MR * KH + h0 * xs, xs, wb + j * chunk * PW,
                       chunk * PW, hs, cs.data() + b * MR * ldc + j * PW, ldc, h0 == 0, NextPanels{});
        h0 += chunk;
      } while (h0 < KH);
      for (int64_t b = 0; b < blk.n; ++b)
        store_rows_bf16(cvt, cs.data() + b * MR * ldc, ldc, blk.rows(b), p, np, outs, nullptr, gated,
                        out + blk.start(b) * ldo, ldo);
    }
  });
}

}  // namespace moe_bf16
LLMK_NS_END
