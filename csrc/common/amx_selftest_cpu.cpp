// The AMX tiles checked against their software model before the AMX level is used: one 2 x 2 step
// (two A tiles, two B tiles) on small integers, whose products and sums are exact in fp32, so the
// hardware and the model must agree to the bit. It catches a tile layout or operand order that
// differs from the model (which the tests check everywhere) on the CPUs where the tiles run.
#include <cstdint>
#include <cstring>

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

LLMK_NS_END
