// AMX tiles for the CPU kernels' bf16 GEMMs, as two interchangeable backends with one interface:
//   HwTiles  - the CPU's tile registers (tileloadd / tdpbf16ps / tilestored);
//   EmuTiles - a software model of the same eight registers and instructions, so that the kernels
//              written on the tiles run, and are tested, on any AVX-512 CPU (LLMKERN_CPU_ISA=amx-emulated).
// A kernel is a template over the backend; both instantiations come from one source.
//
// Every kernel uses the same fixed assignment (palette 1, all tiles 16 rows x 64 bytes):
//   tmm0..3  C: fp32 accumulators, a 2 x 2 block of 16 x 16 (rows 0-15 / 16-31 x panels 0 / 1)
//   tmm4, 5  A: 16 rows x 32 bf16 (16 k pairs) of x each
//   tmm6, 7  B: 16 k pairs x 16 features x 2, i.e. 16 k pairs of one packed weight panel (the
//            layout gemm_bf16_cpu.h packs: a panel's consecutive k pairs are consecutive 64-byte rows)
// step() is C[i][j] += A[i] . B[j] for the 2 x 2 block (4 tdpbf16ps: 32 x 32 outputs x 32 k).
// A tile that would hold no data (fewer than 17 rows, one panel) is loaded from zero_tile() with
// stride 0 rather than left out: one shape, one code path.
//
// Tile state is per thread: a kernel calls config() on each thread before its first tile op and
// release() after its last (Linux frees the tile state on release).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/macros.h"

#if defined(__AVX512F__) && defined(LLMK_WITH_AMX) && LLMK_WITH_AMX && defined(__GNUC__) && !defined(__clang__)
#define LLMK_AMX_TILES 1
#else
#define LLMK_AMX_TILES 0
#endif

#if LLMK_AMX_TILES
#include <immintrin.h>

LLMK_NS_BEGIN
namespace amx {

constexpr int kRows = 16, kColBytes = 64;

// 16 x 64 zero bytes: the source of tiles with no data (stride 0 re-reads one row).
inline const void* zero_tile() {
  alignas(64) static const uint8_t z[kColBytes] = {};
  return z;
}

// The ldtilecfg operand: palette 1, eight tiles of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = kColBytes;
      rows[t] = kRows;
    }
  }
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Software model of tdpbf16ps on 16 x 16 fp32, 16 x 32 bf16 A and 16 (pairs) x 32 bf16 B: each
// output adds, for k pair 0..15 in order, the even product and then the odd one (the SDM's order;
// a bf16 x bf16 product is exact in fp32, so each addition rounds once).
LLMK_ALWAYS_INLINE void dpbf16_model(float (&c)[16][16], const uint16_t (&a)[16][32], const uint16_t (&b)[16][32]) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc = c[m][n];
      for (int k = 0; k < 16; ++k) {
        uint32_t u;
        float a0, a1, b0, b1;
        u = uint32_t(a[m][2 * k]) << 16, std::memcpy(&a0, &u, 4);
        u = uint32_t(a[m][2 * k + 1]) << 16, std::memcpy(&a1, &u, 4);
        u = uint32_t(b[k][2 * n]) << 16, std::memcpy(&b0, &u, 4);
        u = uint32_t(b[k][2 * n + 1]) << 16, std::memcpy(&b1, &u, 4);
        acc += a0 * b0;
        acc += a1 * b1;
      }
      c[m][n] = acc;
    }
}

struct EmuTiles {
  struct State {
    float c[4][16][16];
    uint16_t a[2][16][32], b[2][16][32];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void load(void* dst, const void* src, int64_t stride) {
    for (int r = 0; r < kRows; ++r)
      std::memcpy(static_cast<uint8_t*>(dst) + r * kColBytes, static_cast<const uint8_t*>(src) + r * stride, kColBytes);
  }
  static void config() {}
  static void release() {}
  static void zero_c() { std::memset(state().c, 0, sizeof state().c); }
  // C tile (i, j) at c + (16 i) * ldc + 16 j, ldc in floats.
  static void load_c(const float* c, int64_t ldc) {
    for (int t = 0; t < 4; ++t) load(state().c[t], c + (t / 2) * 16 * ldc + (t % 2) * 16, ldc * 4);
  }
  static void store_c(float* c, int64_t ldc) {
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < kRows; ++r) std::memcpy(c + ((t / 2) * 16 + r) * ldc + (t % 2) * 16, state().c[t][r], kColBytes);
  }
  static void step(const void* a0, int64_t sa0, const void* a1, int64_t sa1, const void* b0, int64_t sb0,
                   const void* b1, int64_t sb1) {
    State& s = state();
    load(s.a[0], a0, sa0);
    load(s.a[1], a1, sa1);
    load(s.b[0], b0, sb0);
    load(s.b[1], b1, sb1);
    for (int t = 0; t < 4; ++t) dpbf16_model(s.c[t], s.a[t / 2], s.b[t % 2]);
  }
};

// The tile instructions' register operands are immediates, hence the spelled-out tile numbers.
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
struct HwTiles {
  static void config() {
    static const TileConfig cfg;
    _tile_loadconfig(&cfg);
  }
  static void release() { _tile_release(); }
  static LLMK_ALWAYS_INLINE void zero_c() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  static LLMK_ALWAYS_INLINE void load_c(const float* c, int64_t ldc) {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  }
  static LLMK_ALWAYS_INLINE void store_c(float* c, int64_t ldc) {
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  }
  static LLMK_ALWAYS_INLINE void step(const void* a0, int64_t sa0, const void* a1, int64_t sa1, const void* b0,
                                      int64_t sb0, const void* b1, int64_t sb1) {
    _tile_loadd(4, a0, sa0);
    _tile_loadd(6, b0, sb0);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1, sb1);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1, sa1);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
};
#pragma GCC pop_options

}  // namespace amx
LLMK_NS_END
#endif
