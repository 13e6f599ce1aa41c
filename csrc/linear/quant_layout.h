// The packed layout of a weight-only quantised projection (GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K /
// Q6_K, packed by ops/linear_gguf.py), shared by the CPU kernels and the CUDA kernel.
//
// Every GGUF block format decodes to w[n][k] = d * u + m per sub-block of `block` k values, with an
// unsigned code u and one scale d and offset m per (row, sub-block). The packer rewrites a tensor
// into that form, 16 output rows (a panel) at a time:
//   packed[panel][kb] = codes (16 * block * bits / 8 bytes) | d[16] (fp16) | m[16] (fp16)
// Codes are grouped by 4 consecutive k: group g of a sub-block is one 64-byte vector whose byte
// 4f + e is row f's code at k = 4g + e, the operand layout of a u8 x s8 dot product over 4 k
// (AVX512-VNNI's vpdpbusd, CUDA's dp4a) for 16 rows at once.
//   bits 8: group g at byte 64g.
//   bits 4: two groups per 64 bytes: chunk c holds group c in its low nibbles and group c + G/2 in
//           its high nibbles (G = block / 4 groups), so one load and two masks give both.
// Layouts: (bits 4, block 32) Q4_0 / Q4_1 / Q4_K; (bits 8, block 32) Q8_0 / Q5_K; (bits 8,
// block 16) Q6_K. Padding rows (out_features not a multiple of 16) have d = m = 0.
#pragma once
#include <cstdint>

#include "common/macros.h"

LLMK_NS_BEGIN
namespace qlayout {

constexpr int kPanel = 16;     // output rows per panel
constexpr int kGroupK = 4;     // k values per code group (one 32-bit lane per row)
constexpr int kXBlock = 32;    // activations are quantised to int8 per 32 k values

// Layout ids as the Python side passes them.
enum Id : int { U4B32 = 0, U8B32 = 1, U8B16 = 2 };

struct Layout {
  int bits;
  int block;
  LLMK_HD int groups() const { return block / kGroupK; }
  LLMK_HD int64_t code_bytes() const { return int64_t(kPanel) * block * bits / 8; }
  LLMK_HD int64_t block_bytes() const { return code_bytes() + 2 * kPanel * 2; }  // + d, m (fp16)
};

LLMK_HD Layout layout_of(int id) {
  return id == U4B32 ? Layout{4, 32} : id == U8B32 ? Layout{8, 32} : Layout{8, 16};
}

LLMK_HD bool valid_id(int64_t id) { return id == U4B32 || id == U8B32 || id == U8B16; }

// Row f's code at k (0 <= k < block) in a packed sub-block `blk`.
LLMK_HD int code_at(const uint8_t* blk, const Layout& L, int f, int k) {
  const int g = k / kGroupK, e = k % kGroupK;
  if (L.bits == 8) return blk[g * 64 + f * 4 + e];
  const int half = L.groups() / 2;
  const uint8_t b = blk[(g % half) * 64 + f * 4 + e];
  return g < half ? (b & 0xF) : (b >> 4);
}

// fp16 bit patterns of row f's scale and offset in a packed sub-block.
LLMK_HD uint16_t scale_bits(const uint8_t* blk, const Layout& L, int f) {
  const uint8_t* p = blk + L.code_bytes() + 2 * f;
  return uint16_t(p[0] | (p[1] << 8));
}
LLMK_HD uint16_t offset_bits(const uint8_t* blk, const Layout& L, int f) {
  const uint8_t* p = blk + L.code_bytes() + 2 * kPanel + 2 * f;
  return uint16_t(p[0] | (p[1] << 8));
}

}  // namespace qlayout
LLMK_NS_END
