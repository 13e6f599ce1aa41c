// The bf16 packed GEMM on AMX tiles (common/amx_tiles_cpu.h): the same weights, epilogues and
// results as gemm_bf16_cpu.h's vdpbf16ps GEMM, for x of >= kAmxMinRows rows (prefill projections,
// gate/up with the fused SiLU, the LM head over many rows). Fewer rows stay on the AVX-512 GEMM,
// which is bound by reading W either way.
//
// The packed panels need no repacking: 16 consecutive k pairs of a panel are one B tile (16 rows of
// 16 features x 2, 64 bytes apart). x is read in place as A tiles (16 rows x 32 k, row stride ldx)
// when K is a multiple of 32; otherwise, and for the last partial 16 rows, from a zero-padded copy.
// The last partial group of k pairs of a panel (K not a multiple of 32) goes through a zero-padded
// copy of its rows, so no tile reads past the end of the weights.
//
// Work: units of two panels (32 features, or a gate/up pair) by row groups of kGroupBlocks blocks of
// 32 rows. Items run row super-group (~kXBlockBytes of x, which then stays in L2) by super-group and,
// within one, unit-major; a thread takes consecutive items. k runs in chunks of kChunkPairs pairs
// (see below: the chunk stays in L1), the fp32 blocks of the group parked in a local buffer between
// chunks; a group of one block keeps them in the tiles over all of k.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/amx_tiles_cpu.h"
#include "common/dispatch.h"
#include "linear/gemm_bf16_cpu.h"

LLMK_NS_BEGIN
namespace gemm {

// From 4 rows the tiles win although a 16-row tile then holds zeros; below, reading W bounds both
// paths and the vdpbf16ps GEMM wastes no work (measured on a Xeon with AMX: qkv 576 x 960 at 4 rows
// 38 vs 47 us, gate/up 576 x 3072 78 vs 106 us; at 1-2 rows AVX-512 is faster or even).
constexpr int64_t kAmxMinRows = 4;

#if LLMK_AMX_TILES

constexpr int kBlockRows = 32;         // two A tiles
// Sized so that a work item's k chunk stays in L1 (48 KB): the unit's B chunk (2 x 96 x 64 B = 12 KB),
// the group's A rows (2 x 32 rows x 192 bf16 = 24 KB) and its fp32 blocks (8 KB). Tile loads that
// miss L1 run at about half speed; with 8 blocks of 256 pairs (the first choice) the working set was
// 3x L1 and prefill-sized GEMMs ran 15-25% slower.
constexpr int64_t kGroupBlocks = 2;    // row blocks per work item
constexpr int64_t kChunkPairs = 96;    // k pairs per chunk

struct AmxGemmArgs {
  int64_t M, KH, N, npanels, ngroups, nblocks;
  int64_t super_groups, super_items;  // row groups per super-group; items per full super-group
  const uint16_t* a;   // A rows: x (row stride lda elements) or its padded copy
  int64_t lda;
  int64_t direct_rows; // rows [0, direct_rows) come from a; the rest from tail (16-row padded copy)
  const uint16_t* tail;
  int64_t ltail;
  const uint32_t* w;   // packed panels, pstride words apart
  int64_t pstride;
  const uint16_t* bias;
  bool gated;
  bool cvt;            // round the output with vcvtneps2bf16 (cpu_bf16_cvt)
  uint16_t* out;
  float* out32;        // when set, in place of out: fp32 rows holding the bf16 results
  int64_t ldo;
};

// Item i's unit (and row group): items run super-group by super-group; within one, unit-major
// (see gemm_bf16_amx).
inline int64_t item_unit(const AmxGemmArgs& g, int64_t i, int64_t* grp = nullptr) {
  const int64_t sup = i / g.super_items, in_sup = i % g.super_items;
  const int64_t g0 = sup * g.super_groups, gn = std::min(g.super_groups, g.ngroups - g0);
  if (grp) *grp = g0 + in_sup % gn;
  return in_sup / gn;
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

// Items [i0, i1) of (unit, row group), unit-major, on tile backend Tiles.
template <typename Tiles>
void amx_items(const AmxGemmArgs& g, int64_t i0, int64_t i1) {
  alignas(64) float cbuf[kGroupBlocks][kBlockRows * 2 * PW];
  alignas(64) uint32_t btail[2][16 * PW];
  const int64_t full_steps = g.KH / 16, steps = (g.KH + 15) / 16;
  const int64_t sa = g.lda * 2, st = g.ltail * 2;
  Tiles::config();
  int64_t tail_unit = -1;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t grp;
    const int64_t u = item_unit(g, i, &grp);
    const int64_t p0 = 2 * u;
    const int np = int(std::min<int64_t>(2, g.npanels - p0));
    if (steps != full_steps && tail_unit != u) {  // the unit's last, partial group of k pairs, zero-padded
      const int64_t rem = g.KH - full_steps * 16;
      for (int j = 0; j < 2; ++j) {
        std::memset(btail[j], 0, sizeof btail[j]);
        if (j < np) std::memcpy(btail[j], g.w + (p0 + j) * g.pstride + full_steps * 16 * PW, rem * PW * 4);
      }
      tail_unit = u;
    }
    const int64_t b0 = grp * kGroupBlocks, b1 = std::min(g.nblocks, b0 + kGroupBlocks);
    // The next item's unit, when it is another one (a decode step: every item), streams into L2
    // meanwhile: each block of this item prefetches its share of the 16 lines per panel and step.
    // Without it a decode step's tile loads waited on memory (bf16 W read at ~10 of ~21 GB/s).
    const int64_t un = i + 1 < i1 ? item_unit(g, i + 1) : u;
    const char* next = un != u ? reinterpret_cast<const char*>(g.w + 2 * un * g.pstride) : nullptr;
    const int npn = next ? int(std::min<int64_t>(2, g.npanels - 2 * un)) : 0;
    // A group of one block (x of <= 32 rows: batched decode steps, an MoE expert's few tokens; or
    // the last of an odd count) keeps its C tiles in the registers over all of k: its A rows are
    // 2 KB a step, nothing to keep in L1, and parking the C tiles every chunk held such a GEMM's
    // read of W to ~60% of the memory's rate (~75% without). Same sums, same order: same bits.
    const int64_t chunk = b1 - b0 == 1 ? std::max<int64_t>(steps, 1) * 16 : kChunkPairs;
    for (int64_t h0 = 0; h0 < steps * 16 || h0 == 0; h0 += chunk) {
      const int64_t s0 = h0 / 16, s1 = std::min(steps, (h0 + chunk) / 16);
      const bool first = h0 == 0, last = h0 + chunk >= steps * 16;
      for (int64_t b = b0; b < b1; ++b) {
        float* c = cbuf[b - b0];
        if (first) Tiles::zero_c();
        else Tiles::load_c(c, 2 * PW);
        // A tile r of this block: rows [row, row + 16) in place, from the padded tail, or none.
        const void* ap[2];
        int64_t as[2];
        for (int r = 0; r < 2; ++r) {
          const int64_t row = b * kBlockRows + r * 16;
          if (row + 16 <= g.direct_rows) ap[r] = g.a + row * g.lda, as[r] = sa;
          else if (row < g.M) ap[r] = g.tail + (row - g.direct_rows) * g.ltail, as[r] = st;
          else ap[r] = nullptr, as[r] = 0;
        }
        const int l0 = int(16 * (b - b0) / (b1 - b0)), l1 = int(16 * (b - b0 + 1) / (b1 - b0));
        for (int64_t s = s0; s < s1; ++s) {
          if (next && s < full_steps)
            for (int j = 0; j < npn; ++j)
              for (int l = l0; l < l1; ++l) __builtin_prefetch(next + (j * g.pstride + s * 16 * PW) * 4 + l * 64, 0, 2);
          const void* bp[2];
          for (int j = 0; j < 2; ++j)
            bp[j] = j >= np ? amx::zero_tile()
                    : s < full_steps ? static_cast<const void*>(g.w + (p0 + j) * g.pstride + s * 16 * PW)
                                     : static_cast<const void*>(btail[j]);
          const int64_t k = s * 32;  // bf16 elements into the row
          Tiles::step(ap[0] ? static_cast<const uint16_t*>(ap[0]) + k : amx::zero_tile(), ap[0] ? as[0] : 0,
                      ap[1] ? static_cast<const uint16_t*>(ap[1]) + k : amx::zero_tile(), ap[1] ? as[1] : 0,
                      bp[0], bp[0] == amx::zero_tile() ? 0 : 64, bp[1], bp[1] == amx::zero_tile() ? 0 : 64);
        }
        Tiles::store_c(c, 2 * PW);
        if (last) {
          const int64_t row0 = b * kBlockRows;
          store_rows_bf16_at(g.cvt, c, 2 * PW, int(std::min<int64_t>(kBlockRows, g.M - row0)), p0, np, g.N, g.bias,
                             g.gated, g.out, g.out32, row0, g.ldo);
        }
      }
      if (last) break;
    }
  }
  Tiles::release();
}

#pragma GCC pop_options

// out [M, N] = x W^T + bias (or the gated SiLU of gate/up pairs), W packed in k pairs as for
// gemm_bf16, on AMX tiles or their software model.
inline void gemm_bf16_amx(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                          const uint16_t* bias, bool gated, uint16_t* out, int64_t ldo, bool emulated,
                          float* out32 = nullptr) {
  AmxGemmArgs g{};
  g.M = M;
  g.KH = (K + 1) / 2;
  g.N = N;
  g.npanels = (gated ? 2 : 1) * num_panels(N);
  g.nblocks = (M + kBlockRows - 1) / kBlockRows;
  g.ngroups = (g.nblocks + kGroupBlocks - 1) / kGroupBlocks;
  g.w = reinterpret_cast<const uint32_t*>(packed);
  g.pstride = g.KH * PW;
  g.bias = bias;
  g.gated = gated;
  g.cvt = ::llmk::cpu_bf16_cvt();
  g.out = out;
  g.out32 = out32;
  g.ldo = ldo;
  // A rows: in place when a row's k pairs fill whole tiles, else all from a padded copy.
  const int64_t kpad = (g.KH + 15) / 16 * 32;
  const bool in_place = K % 32 == 0;
  g.direct_rows = in_place ? M / 16 * 16 : 0;
  const int64_t copied = M - g.direct_rows, copied_pad = (copied + 15) / 16 * 16;
  thread_local std::vector<uint16_t> pad;
  if (pad.size() < size_t(copied_pad * kpad)) pad.resize(size_t(copied_pad * kpad));
  uint16_t* const padp = pad.data();  // the caller's buffer: `pad` names another one on each worker thread
  parallel_for(copied_pad, copied * K >= (1 << 18) ? 16 : copied_pad, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint16_t* d = padp + r * kpad;
      const int64_t n = r < copied ? K : 0;
      if (n) std::memcpy(d, x + (g.direct_rows + r) * ldx, size_t(n) * 2);
      std::memset(d + n, 0, size_t(kpad - n) * 2);
    }
  });
  g.a = x;
  g.lda = ldx;
  g.tail = padp;
  g.ltail = kpad;
  // Row super-groups of about gemm::kXBlockBytes of x, each swept by every unit: x then stays in L2
  // and W is re-read once per super-group, instead of all of x coming from L3 for every unit.
  const int64_t nunits = (g.npanels + 1) / 2, nitems = nunits * g.ngroups;
  g.super_groups = units_per_x_block(kGroupBlocks * kBlockRows * g.KH * 4);
  g.super_items = nunits * g.super_groups;
  const int64_t kh1 = std::max<int64_t>(g.KH, 1), rows = std::min<int64_t>(M, kGroupBlocks * kBlockRows);
  const int64_t grain = task_grain(kh1 * PW * 4 * 2, 2 * rows * kh1 * 2 * PW * 2);
  parallel_for(nitems, grain, [&](int64_t i0, int64_t i1) {
    if (emulated) amx_items<amx::EmuTiles>(g, i0, i1);
    else amx_items<amx::HwTiles>(g, i0, i1);
  });
}

#endif  // LLMK_AMX_TILES

// True when gemm_bf16_amx runs M rows: a tile build, the AMX level chosen, M >= kAmxMinRows.
inline bool use_amx(int64_t M) {
#if LLMK_AMX_TILES
  return M >= kAmxMinRows && ::llmk::amx_mode() != ::llmk::AmxMode::Off;
#else
  (void)M;
  return false;
#endif
}

// The bf16 GEMM as every caller runs it (linear_packed, the MoE experts): on AMX tiles from
// kAmxMinRows rows when the AMX level runs, else gemm_bf16 (its x-pair scratch kept per thread).
// out32: see gemm_bf16.
inline void gemm_bf16_run(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                          const uint16_t* bias, bool gated, uint16_t* out, int64_t ldo, float* out32 = nullptr) {
#if LLMK_AMX_TILES
  if (use_amx(M))
    return gemm_bf16_amx(x, ldx, M, K, packed, N, bias, gated, out, ldo,
                         ::llmk::amx_mode() == ::llmk::AmxMode::Emulated, out32);
#endif
  thread_local std::vector<uint32_t> xpack;
  const size_t need = size_t(xpack_pairs_words(M, K));
  if (xpack.size() < need) xpack.resize(need);
  gemm_bf16(x, ldx, M, K, packed, N, bias, gated, out, ldo, xpack.data(), out32);
}

}  // namespace gemm
LLMK_NS_END
