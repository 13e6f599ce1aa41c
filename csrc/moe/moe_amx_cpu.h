// The MoE experts' bf16 GEMMs on AMX tiles over weights as fused_moe receives them, unpacked
// ([N, K] row-major): the weight rows are the A operand, read in place (16 rows x 32 k per tile,
// nothing repacked), and the expert's token rows, turned into k pairs once per call, are B. The
// tiles compute C^T = W X^T; each 32 x 32 block is transposed back and goes through the packed
// GEMM's epilogue (store_rows_bf16: the gated SiLU for gate/up, bf16 rounding). Every output is the
// packed AMX GEMM's sum in the same order (k pairs in order; a bf16 product is exact in fp32, so
// which side is A does not matter), so plain and packed experts give the same bits.
// Needs hidden and intermediate sizes that are multiples of 32: whole tiles along k for both GEMMs,
// and whole 32-row units of w2.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/amx_tiles_cpu.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "linear/gemm_bf16_cpu.h"
#include "moe/moe_math.h"

#if LLMK_AMX_TILES
LLMK_NS_BEGIN
namespace moe_amx {

constexpr int kT = 16;  // tokens per B tile (16 k pairs x 16 tokens x 2)

// Words of B for M token rows of K (two tiles per 32 tokens, zero-padded).
inline int64_t xt_words(int64_t M, int64_t K) { return (M + 31) / 32 * 2 * (K / 2) * kT; }

// x [M, K] bf16 (row stride ldx) -> xt [tile][K / 2 k pairs][16 tokens] 32-bit words: word kp of
// token row t * 16 + m at (t * K / 2 + kp) * 16 + m; padding tokens are zero.
inline void pack_xt(const uint16_t* x, int64_t ldx, int64_t M, int64_t K, uint32_t* xt) {
  const int64_t KH = K / 2, nt = (M + 31) / 32 * 2;
  for (int64_t t = 0; t < nt; ++t) {
    uint32_t* dst = xt + t * KH * kT;
    for (int m = 0; m < kT; ++m) {
      const int64_t row = t * kT + m;
      if (row >= M) {
        for (int64_t kp = 0; kp < KH; ++kp) dst[kp * kT + m] = 0;
        continue;
      }
      const uint16_t* src = x + row * ldx;
      for (int64_t kp = 0; kp < KH; ++kp) std::memcpy(dst + kp * kT + m, src + 2 * kp, 4);
    }
  }
}

// dst[m][r] = src[r][m] for a 32 x 32 fp32 block (row strides 32).
LLMK_ALWAYS_INLINE void transpose32(const float* src, float* dst) {
  for (int bi = 0; bi < 2; ++bi)
    for (int bj = 0; bj < 2; ++bj) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(src + (bi * 16 + i) * 32 + bj * 16);
      vec::transpose16_epi32(r);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(dst + (bj * 16 + i) * 32 + bi * 16, r[i]);
    }
}

struct WxArgs {
  const uint16_t* w;  // [N, K] bf16 as stored; N and K multiples of 32
  int64_t N, K;
  bool gated;         // N = 2 I: gate rows [0, I), up rows [I, 2 I); out [M, I] = silu(gate) * up
  const uint32_t* xt; // pack_xt of the M token rows
  int64_t M;
  bool cvt;           // round with vcvtneps2bf16 (cpu_bf16_cvt)
  uint16_t* out;
  int64_t ldo;
  // Units: gated, unit q = gate rows [16 q, 16 q + 16) with the same up rows; else rows [32 q, 32 q + 32).
  int64_t units() const { return gated ? N / 2 / kT : N / 32; }
};

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

template <typename Tiles>
void wx_units(const WxArgs& g, int64_t u0, int64_t u1) {
  alignas(64) float cw[32 * 32];  // C^T: weight rows x tokens
  alignas(64) float ct[32 * 32];  // C: tokens x weight rows, the epilogue's layout
  const int64_t KH = g.K / 2, steps = g.K / 32, pairs = (g.M + 31) / 32, sw = g.K * 2, I = g.N / 2;
  Tiles::config();
  // A unit's weight rows are two runs of 16 rows (32 KB at K = 1024), each contiguous. With few
  // tokens (a decode step's experts: up to 64, two pairs of 16-token tiles) the read of W bounds
  // the GEMM, and the first pair's steps prefetch the next unit's two runs in address order, an
  // even share of lines per step: the tile loads alone, 32 rows a step, read W at ~65% of the
  // memory's rate, and a prefetch of the same lines in tile order (row by row at each step's k)
  // was slower still.
  const int64_t run_lines = kT * g.K * 2 / 64;
  const int64_t per_step = steps > 0 ? (run_lines + steps - 1) / steps : 0;
  auto run = [&](int64_t u, int r) { return g.w + moe::stored_unit_row(g.gated, I, u, r) * g.K; };
  for (int64_t u = u0; u < u1; ++u) {
    const uint16_t* a0 = run(u, 0);
    const uint16_t* a1 = run(u, 1);
    const bool pf = pairs <= 2 && u + 1 < u1;
    const char* n0 = pf ? reinterpret_cast<const char*>(run(u + 1, 0)) : nullptr;
    const char* n1 = pf ? reinterpret_cast<const char*>(run(u + 1, 1)) : nullptr;
    for (int64_t tp = 0; tp < pairs; ++tp) {
      const uint32_t* b0 = g.xt + 2 * tp * KH * kT;
      const bool has_b1 = 32 * tp + kT < g.M;
      Tiles::zero_c();
      for (int64_t s = 0; s < steps; ++s) {
        if (n0 && tp == 0)
          for (int64_t l = s * per_step; l < std::min(run_lines, (s + 1) * per_step); ++l) {
            __builtin_prefetch(n0 + l * 64, 0, 2);
            __builtin_prefetch(n1 + l * 64, 0, 2);
          }
        Tiles::step(a0 + s * 32, sw, a1 + s * 32, sw, b0 + s * kT * kT, 64,
                    has_b1 ? b0 + (KH + s * kT) * kT : amx::zero_tile(), has_b1 ? 64 : 0);
      }
      Tiles::store_c(cw, 32);
      transpose32(cw, ct);
      gemm::store_rows_bf16(g.cvt, ct, 32, int(std::min<int64_t>(32, g.M - 32 * tp)), 2 * u, 2, g.gated ? I : g.N,
                            nullptr, g.gated, g.out + 32 * tp * g.ldo, g.ldo);
    }
  }
  Tiles::release();
}

#pragma GCC pop_options

// out = X W^T through the epilogue (see WxArgs), on the CPU's tiles or their software model.
inline void gemm_wx(const WxArgs& g, bool emulated) {
  const int64_t n = g.units();
  parallel_for(n, std::max<int64_t>(1, n / 64), [&](int64_t u0, int64_t u1) {
    if (emulated) wx_units<amx::EmuTiles>(g, u0, u1);
    else wx_units<amx::HwTiles>(g, u0, u1);
  });
}

}  // namespace moe_amx
LLMK_NS_END
#endif  // LLMK_AMX_TILES
