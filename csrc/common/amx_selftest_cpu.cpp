// The AMX tiles checked against their software model before the AMX level is used: one 2 x 2 step
// (two A tiles, two B tiles) on small integers, whose products and sums are exact in fp32, so the
// hardware and the model must agree to the bit. It catches a tile layout or operand order that
// differs from the model (which the tests check everywhere) on the CPUs where the tiles run. The
// int8 tiles likewise: one step of each sub-block size on bytes of both signs and large codes.
#include <cstdint>
#include <cstring>

#include "common/amx_int8_tiles_cpu.h"
#include "common/amx_tiles_cpu.h"
#include "common/macros.h"

LLMK_NS_BEGIN

#if LLMK_AMX_TILES
namespace {

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
template <typename Tiles>
void one_step(const uint16_t* a, const uint16_t* b, float* c) {
  Tiles::config();
  Tiles::zero_c();
  Tiles::step(a, 64, a + 16 * 32, 64, b, 64, b + 16 * 32, 64);
  Tiles::store_c(c, 32);
  Tiles::release();
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")
template <typename Tiles>
void one_int8_step(const int8_t* a, const uint8_t* b, int block, int32_t (*c)[16][16]) {
  Tiles::config(block);
  Tiles::step(a, a + 16 * 64, 64, b, b + 4 * 64, c);  // B tiles overlap: any bytes will do
  Tiles::release();
}
#pragma GCC pop_options

}  // namespace
#endif

bool amx_tiles_agree() {
#if LLMK_AMX_TILES
  alignas(64) uint16_t a[32 * 32], b[2 * 16 * 32];
  alignas(64) float hw[32 * 32], model[32 * 32];
  auto bf16 = [](int v) {  // small integers are exact in bf16
    const float f = float(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t(u >> 16);
  };
  for (int i = 0; i < 32 * 32; ++i) a[i] = bf16((i * 7 + 3) % 9 - 4);
  for (int i = 0; i < 2 * 16 * 32; ++i) b[i] = bf16((i * 5 + 1) % 7 - 3);
  one_step<amx::HwTiles>(a, b, hw);
  one_step<amx::EmuTiles>(a, b, model);
  return std::memcmp(hw, model, sizeof hw) == 0;
#else
  return false;
#endif
}

bool amx_int8_tiles_agree() {
#if LLMK_AMX_TILES
  alignas(64) int8_t a[32 * 64];
  alignas(64) uint8_t b[12 * 64];
  alignas(64) int32_t hw[4][16][16], model[4][16][16];
  for (int i = 0; i < 32 * 64; ++i) a[i] = int8_t((i * 37 + 11) % 256 - 128);
  for (int i = 0; i < 12 * 64; ++i) b[i] = uint8_t((i * 53 + 7) % 256);
  for (int block = 32; block >= 16; block -= 16) {
    one_int8_step<amx::I8HwTiles>(a, b, block, hw);
    one_int8_step<amx::I8EmuTiles>(a, b, block, model);
    if (std::memcmp(hw, model, sizeof hw) != 0) return false;
  }
  return true;
#else
  return false;
#endif
}

LLMK_NS_END
