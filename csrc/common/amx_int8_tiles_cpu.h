// AMX-INT8 tiles for the weight-only quantised projections, as two backends with one interface
// (like amx_tiles_cpu.h's bf16 ones): I8HwTiles runs tdpbsud on the CPU's tiles, I8EmuTiles is a
// software model of the same registers and instruction (LLMKERN_CPU_ISA=amx-emulated). Integer dot
// products are exact, so both give the same int32 sums bit for bit.
//
// Fixed assignment (palette 1), for a sub-block of `block` k (32 or 16):
//   tmm0..3  C: int32, 16 rows x 16 features; a 2 x 2 block (rows 0-15 / 16-31 x panels 0 / 1)
//   tmm4, 5  A: 16 rows x block signed bytes of quantised x (the activations read in place)
//   tmm6, 7  B: block / 4 rows x 64 unsigned bytes: a packed sub-block's code groups (quant_layout.h:
//            byte 4f + e of group g is feature f's code at k = 4g + e, tdpbsud's B layout as is)
// step() zeroes C, computes C[i][j] = A[i] . B[j] and stores the four tiles to c[4][16][16] (tile
// t = 2i + j): every (row, sub-block) has its own scale, so each sub-block's sums leave the tiles.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/amx_tiles_cpu.h"

#if LLMK_AMX_TILES
LLMK_NS_BEGIN
namespace amx {

// The ldtilecfg operand for sub-blocks of `block` k.
inline TileConfig int8_config(int block) {
  TileConfig cfg;
  for (int t = 4; t < 6; ++t) cfg.colsb[t] = uint16_t(block);
  for (int t = 6; t < 8; ++t) cfg.rows[t] = uint8_t(block / 4);
  return cfg;
}

// Software model of tdpbsud on a 16 x 16 int32 tile: c[m][n] += sum_k a[m][k] * b[k / 4][4n + k % 4],
// a signed, b unsigned (wrap-around int32 additions, as the instruction).
inline void dpbsud_model(int32_t (&c)[16][16], const int8_t* a, const uint8_t* b, int block) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      uint32_t acc = uint32_t(c[m][n]);
      for (int k = 0; k < block; ++k) acc += uint32_t(int32_t(a[m * kColBytes + k]) * int32_t(b[(k / 4) * kColBytes + 4 * n + k % 4]));
      c[m][n] = int32_t(acc);
    }
}

struct I8EmuTiles {
  struct State {
    int block;
    int32_t c[4][16][16];
    int8_t a[2][16 * kColBytes];
    uint8_t b[2][16 * kColBytes];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void config(int block) { state().block = block; }
  static void release() {}
  static void step(const int8_t* a0, const int8_t* a1, int64_t sa, const uint8_t* b0, const uint8_t* b1,
                   int32_t (*c)[16][16]) {
    State& s = state();
    const int B = s.block;
    for (int r = 0; r < kRows; ++r) {  // tileloadd: rows x colsb bytes
      std::memcpy(s.a[0] + r * kColBytes, a0 + r * sa, B);
      std::memcpy(s.a[1] + r * kColBytes, a1 + r * sa, B);
    }
    for (int r = 0; r < B / 4; ++r) {
      std::memcpy(s.b[0] + r * kColBytes, b0 + r * kColBytes, kColBytes);
      std::memcpy(s.b[1] + r * kColBytes, b1 + r * kColBytes, kColBytes);
    }
    std::memset(s.c, 0, sizeof s.c);
    for (int t = 0; t < 4; ++t) dpbsud_model(s.c[t], s.a[t / 2], s.b[t % 2], B);
    std::memcpy(c, s.c, sizeof s.c);
  }
};

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")
struct I8HwTiles {
  // Static: _tile_loadconfig's asm names only 8 bytes of its operand as read, so GCC drops the
  // stores of a local config's other 56.
  static void config(int block) {
    static const TileConfig cfg32 = int8_config(32), cfg16 = int8_config(16);
    _tile_loadconfig(block == 32 ? &cfg32 : &cfg16);
  }
  static void release() { _tile_release(); }
  // A rows sa bytes apart; B tiles are dense (64-byte rows). Not inlined, so that a kernel calling
  // it needs no AMX target of its own.
  static void step(const int8_t* a0, const int8_t* a1, int64_t sa, const uint8_t* b0,
                   const uint8_t* b1, int32_t (*c)[16][16]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a0, sa);
    _tile_loadd(6, b0, kColBytes);
    _tile_dpbsud(0, 4, 6);
    _tile_loadd(7, b1, kColBytes);
    _tile_dpbsud(1, 4, 7);
    _tile_loadd(5, a1, sa);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
    _tile_stored(0, c[0], kColBytes);
    _tile_stored(1, c[1], kColBytes);
    _tile_stored(2, c[2], kColBytes);
    _tile_stored(3, c[3], kColBytes);
  }
};
#pragma GCC pop_options

}  // namespace amx
LLMK_NS_END
#endif
