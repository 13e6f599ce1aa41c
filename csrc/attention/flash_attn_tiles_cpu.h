// Tile sizes shared by the CPU attention tile kernels (flash_attn_gemm_cpu.cpp and
// flash_attn_tiles_cpu.cpp; one build per SIMD level).
#pragma once
#include "attention/flash_attn_cpu.h"

LLMK_NS_BEGIN
namespace attn {

constexpr int kBK = 64;  // keys per tile (a multiple of every VL; 32 and 128 measured no better)
constexpr int kMR = 6;   // keys per Q.K^T micro-tile, rows per P.V micro-tile
#if defined(__AVX512F__)
constexpr int kNR = 4;   // vectors per micro-tile: 6 x 4 accumulators of 32 registers
#else
constexpr int kNR = 2;   // 6 x 2 of 16 registers
#endif

LLMK_ALWAYS_INLINE int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace attn
LLMK_NS_END
