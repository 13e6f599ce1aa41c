// CPU weight-only quantised projections on quant_layout.h's packed panels.
//
// x is quantised per 32 k values to int8 (scale dx = max|x| / 127) once per call; then for each
// panel of 16 output rows and each sub-block, one 64-byte code group times 4 x bytes gives 16
// rows x 4 k of integer products (AVX512-VNNI vpdpbusd: u8 codes x s8 activations), and
//   y[f] += dx * d[f] * sum_k(u[f][k] * qx[k]) + m[f] * (dx * sum_k qx[k])
// applies the row's scale and offset once per sub-block (the second sum is per activation block,
// computed when x is quantised). A panel's codes for the whole K (a few KB) stay in L1 while every
// row of x passes over them, eight rows at a time. Without VNNI: AVX2's vpmaddubsw (panel_rows_avx2);
// without AVX2: plain integer C++ on codes unpacked per sub-block.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/amx_int8_tiles_cpu.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "linear/linear_quant.h"
#include "linear/quant_activations_cpu.h"
#include "linear/quant_layout.h"

LLMK_NS_BEGIN

namespace {

using qlayout::kPanel;
using qlayout::kXBlock;
using qlayout::Layout;
using qact::kMeta;
using qact::offset_sum;
using qact::quantize_rows;

constexpr int kRows = 8;     // rows of x per pass over a panel (the VNNI tile's accumulators)
// Panel `w` (its nb sub-blocks) times R rows of quantised x -> acc[R][16] (no bias), any layout.
void panel_rows_generic(const uint8_t* w, const Layout& L, int64_t nb, const int8_t* xq, int64_t K,
                        const float* xm, int R, float (*acc)[kPanel]) {
  const int B = L.block;
  const int64_t bb = L.block_bytes();
  for (int i = 0; i < R; ++i)
    for (int f = 0; f < kPanel; ++f) acc[i][f] = 0.f;
  uint8_t u[kPanel][32];
  float d[kPanel], mo[kPanel];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * bb;
    for (int f = 0; f < kPanel; ++f) {
      for (int k = 0; k < B; ++k) u[f][k] = uint8_t(qlayout::code_at(blk, L, f, k));
      d[f] = f16_bits_to_f32(qlayout::scale_bits(blk, L, f));
      mo[f] = f16_bits_to_f32(qlayout::offset_bits(blk, L, f));
    }
    const int64_t k0 = b * B;
    for (int i = 0; i < R; ++i) {
      const int8_t* xr = xq + i * K + k0;
      const float* mt = xm + (i * (K / kXBlock) + k0 / kXBlock) * kMeta;
      const float sx = offset_sum(mt, B, k0);
      for (int f = 0; f < kPanel; ++f) {
        int32_t s = 0;
        for (int k = 0; k < B; ++k) s += int32_t(u[f][k]) * int32_t(xr[k]);
        acc[i][f] += float(s) * (d[f] * mt[0]) + mo[f] * sx;
      }
    }
  }
}

#if defined(__AVX512F__)
// acc + a sub-block's 16 integer sums s of one row, scaled: s * (d * dx) + m * (dx * sum q). The
// VNNI rows and the AMX tiles both apply it, so their results are the same to the bit.
LLMK_ALWAYS_INLINE __m512 scale_block(__m512 acc, __m512i s, __m512 dw, __m512 mw, const float* mt, int block,
                                      int64_t k0) {
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(mt[0])), acc);
  return _mm512_fmadd_ps(mw, _mm512_set1_ps(offset_sum(mt, block, k0)), acc);
}

#define LLMK_VNNI_TARGET __attribute__((target("avx512vnni,avx512bw,avx512f,f16c")))

// True when the vpdpbusd tiles run: AVX-512 build, a CPU with AVX512_VNNI, LLMKERN_LINEAR_VNNI != 0
// (set it to 0 to test the plain path on such CPUs).
bool vnni() {
  static const bool v = [] {
    const char* env = std::getenv("LLMKERN_LINEAR_VNNI");
    return __builtin_cpu_supports("avx512vnni") && !(env && env[0] == '0');
  }();
  return v;
}

// s[i] += one code group (16 rows x 4 k) . row i's 4 activations at x + i * K.
template <int R>
LLMK_VNNI_TARGET LLMK_ALWAYS_INLINE void dots_vnni(__m512i (&s)[R], __m512i wg, const int8_t* x, int64_t K) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    int32_t x4;
    std::memcpy(&x4, x + i * K, 4);
    s[i] = _mm512_dpbusd_epi32(s[i], wg, _mm512_set1_epi32(x4));
  }
}

template <int R, int BITS, int B>
LLMK_VNNI_TARGET void panel_rows_vnni(const uint8_t* w, int64_t nb, const int8_t* xq, int64_t K, const float* xm,
                                      float (*out)[kPanel]) {
  constexpr int G = B / 4;
  constexpr int64_t CB = int64_t(kPanel) * B * BITS / 8;
  constexpr int64_t BB = CB + 4 * kPanel;
  const int64_t xnb = K / kXBlock;
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // R row accumulators (fp32 and int32) stay in registers; each code group is unpacked right before
  // its R dot products, so at most two of them are live (8 rows: 2 x 8 + 2 + constants of 32 zmm).
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * BB;
    const int64_t k0 = b * B;
    // groups outer, rows inner: R independent vpdpbusd chains in flight (one row's 8 in a row
    // would wait on each other's latency)
    __m512i s[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) s[i] = _mm512_setzero_si512();
    if constexpr (BITS == 4) {
#pragma GCC unroll 8
      for (int c = 0; c < G / 2; ++c) {
        const __m512i v = _mm512_loadu_si512(blk + 64 * c);
        dots_vnni<R>(s, _mm512_and_si512(v, low4), xq + k0 + 4 * c, K);
        dots_vnni<R>(s, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xq + k0 + 4 * (c + G / 2), K);
      }
    } else {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) dots_vnni<R>(s, _mm512_loadu_si512(blk + 64 * g), xq + k0 + 4 * g, K);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + CB)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + CB + 32)));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) acc[i] = scale_block(acc[i], s[i], dw, mw, xm + (i * xnb + k0 / kXBlock) * kMeta, B, k0);
  }
  for (int i = 0; i < R; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

template <int BITS, int B>
void panel_rows_vnni_r(const uint8_t* w, int64_t nb, const int8_t* xq, int64_t K, const float* xm, int R,
                       float (*out)[kPanel]) {
  switch (R) {
    case 1: return panel_rows_vnni<1, BITS, B>(w, nb, xq, K, xm, out);
    case 2: return panel_rows_vnni<2, BITS, B>(w, nb, xq, K, xm, out);
    case 3: return panel_rows_vnni<3, BITS, B>(w, nb, xq, K, xm, out);
    case 4: return panel_rows_vnni<4, BITS, B>(w, nb, xq, K, xm, out);
    case 5: return panel_rows_vnni<5, BITS, B>(w, nb, xq, K, xm, out);
    case 6: return panel_rows_vnni<6, BITS, B>(w, nb, xq, K, xm, out);
    case 7: return panel_rows_vnni<7, BITS, B>(w, nb, xq, K, xm, out);
    default: return panel_rows_vnni<8, BITS, B>(w, nb, xq, K, xm, out);
  }
}
#endif

#if defined(__AVX2__)
// AVX2 (and AVX-512 without VNNI): vpmaddubsw (u8 codes x s8 activations, pairs summed to 16 bits)
// then vpmaddwd by ones (to 32 bits), half a panel (8 rows) per 256-bit vector. 4-bit codes: the 16-bit
// sums of a whole sub-block cannot overflow (8 groups x 2 x 15 x 127 < 2^15); 8-bit codes are split
// into their two nibbles (u = 16 h + l) for the same bound, so every sum is exact.
template <int BITS, int B>
void panel_rows_avx2(const uint8_t* w, int64_t nb, const int8_t* xq, int64_t K, const float* xm, int R,
                     float (*out)[kPanel]) {
  constexpr int G = B / 4;
  constexpr int64_t CB = int64_t(kPanel) * B * BITS / 8;
  constexpr int64_t BB = CB + 4 * kPanel;
  const int64_t xnb = K / kXBlock;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int i = 0; i < R; ++i)
    for (int f = 0; f < kPanel; ++f) out[i][f] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * BB;
    const int64_t k0 = b * B;
    for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7: bytes 32h .. 32h + 31 of each 64-byte group
      __m256i lo[G], hi[BITS == 8 ? G : 1];
      if constexpr (BITS == 4) {
        for (int c = 0; c < G / 2; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * c + 32 * h));
          lo[c] = _mm256_and_si256(v, low4);
          lo[c + G / 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
      } else {
        for (int g = 0; g < G; ++g) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * g + 32 * h));
          lo[g] = _mm256_and_si256(v, low4);
          hi[g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + CB + 16 * h)));
      const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + CB + 32 + 16 * h)));
      for (int i = 0; i < R; ++i) {
        const int8_t* xr = xq + i * K + k0;
        __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
        for (int g = 0; g < G; ++g) {
          int32_t x4;
          std::memcpy(&x4, xr + 4 * g, 4);
          const __m256i xv = _mm256_set1_epi32(x4);
          sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[g], xv));
          if constexpr (BITS == 8) sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[g], xv));
        }
        __m256i s = _mm256_madd_epi16(sl, ones);
        if constexpr (BITS == 8) s = _mm256_add_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(sh, ones), 4));
        const float* mt = xm + (i * xnb + k0 / kXBlock) * kMeta;
        __m256 o = _mm256_loadu_ps(out[i] + 8 * h);
        o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(mt[0])), o);
        o = _mm256_fmadd_ps(mw, _mm256_set1_ps(offset_sum(mt, B, k0)), o);
        _mm256_storeu_ps(out[i] + 8 * h, o);
      }
    }
  }
}
#endif

// acc[R][16] = R rows of quantised x times one panel, on the best path this CPU has.
void panel_rows(const uint8_t* w, const Layout& L, int64_t nb, const int8_t* xq, int64_t K, const float* xm, int R,
                float (*acc)[kPanel]) {
#if defined(__AVX512F__)
  if (vnni()) {
    if (L.bits == 4) return panel_rows_vnni_r<4, 32>(w, nb, xq, K, xm, R, acc);
    if (L.block == 32) return panel_rows_vnni_r<8, 32>(w, nb, xq, K, xm, R, acc);
    return panel_rows_vnni_r<8, 16>(w, nb, xq, K, xm, R, acc);
  }
#endif
#if defined(__AVX2__)
  if (L.bits == 4) return panel_rows_avx2<4, 32>(w, nb, xq, K, xm, R, acc);
  if (L.block == 32) return panel_rows_avx2<8, 32>(w, nb, xq, K, xm, R, acc);
  return panel_rows_avx2<8, 16>(w, nb, xq, K, xm, R, acc);
#endif
  panel_rows_generic(w, L, nb, xq, K, xm, R, acc);
}

// R rows of one output panel (nf features) from their fp32 sums: a, or the gated SiLU(a) * u, or a + bias.
template <DType DT, typename T = vec::elem_t<DT>>
LLMK_ALWAYS_INLINE void store_rows(const float (*a)[kPanel], const float (*u)[kPanel], int R, int nf,
                                   const vec::elem_t<DT>* bias, T* out, int64_t ldo) {
  for (int i = 0; i < R; ++i) {
    T* orow = out + i * ldo;
    for (int f = 0; f < nf; ++f) {
      float v = a[i][f];
      if (u) v = v / (1.f + std::exp(-v)) * u[i][f];
      else if (bias) v += vec::to_f32<DT>(bias[f]);
      orow[f] = vec::from_f32<DT>(v);
    }
  }
}

#if LLMK_AMX_TILES
// From this many rows the 8-bit block-32 layout (Q8_0, Q5_K) runs on AMX-INT8 tiles, below on the
// VNNI rows; both give the same results to the bit. The tiles are bound by their per-sub-block
// epilogue (4 KB of int32 sums stored and scaled per 32 x 32 x 32 step), not by tdpbsud, so they only
// draw level with VNNI. Measured on a Xeon with AMX-INT8, 2 threads, GFLOP/s tiles / VNNI, 512 rows,
// K x N 576 x 1536, 576 x 5632, 2048 x 2048, 2048 x 5632: 8-bit 631/490 444/513 539/567 597/607;
// 32 rows 357/306 (576 x 1536), 662/588 (2048 x 2048). 4-bit codes (unpacked per sub-block) ran
// 369/450 485/490 513/584 620/585 and 511/608 at 32 rows, block 16 (two epilogues per 32 k)
// 377/376 251/414 326/447 349/463: those layouts stay on VNNI at every row count.
constexpr int64_t kAmxMinRows = 32;
constexpr int kAmxBlockRows = 32;  // two A tiles

struct AmxArgs {
  const uint8_t* w;
  int64_t pstride, nb, npanels;
  const int8_t* xq;  // quantised x, zero rows up to a multiple of kAmxBlockRows
  const float* xm;
  int64_t K, M, nrb;  // nrb: blocks of kAmxBlockRows rows
};

// Items [i0, i1) of (unit of two panels, 32-row block), unit-major: a unit's codes stay in cache
// while the row blocks pass. Per sub-block: one 2 x 2 tile step (32 rows x 32 features x block k),
// then each row's 16 sums scaled into fp32 accumulators as the VNNI rows do (scale_block).
template <typename Tiles, DType DT, typename T = vec::elem_t<DT>>
void amx_items(const AmxArgs& g, int64_t i0, int64_t i1, int64_t N, const T* bias, bool gated, T* out,
               int64_t ldo) {
  constexpr int B = kXBlock;                     // the one layout on the tiles: 8-bit codes, 32-k blocks
  constexpr int64_t CB = int64_t(kPanel) * B;    // code bytes of a sub-block
  constexpr int64_t BB = CB + 4 * kPanel;
  const int64_t xnb = g.K / kXBlock;
  // Two sets of tile results: sub-block b + 1's tile step is issued before b's epilogue.
  alignas(64) int32_t c[2][4][16][16];
  alignas(64) float acc[2][kAmxBlockRows][kPanel];
  Tiles::config(B);
  for (int64_t it = i0; it < i1; ++it) {
    const int64_t unit = it / g.nrb, r0 = (it % g.nrb) * kAmxBlockRows, p0 = 2 * unit;
    const int np = int(std::min<int64_t>(2, g.npanels - p0));
    const int8_t* a0 = g.xq + r0 * g.K;
    const uint8_t* w0 = g.w + p0 * g.pstride;
    const uint8_t* w1 = g.w + (p0 + np - 1) * g.pstride;  // a lone panel: computed twice, stored once
    auto issue = [&](int64_t b) {
      Tiles::step(a0 + b * B, a0 + 16 * g.K + b * B, g.K, w0 + b * BB, w1 + b * BB, c[b & 1]);
    };
    std::memset(acc, 0, sizeof acc);
    if (g.nb) issue(0);
    for (int64_t b = 0; b < g.nb; ++b) {
      if (b + 1 < g.nb) issue(b + 1);
      const int64_t k0 = b * B;
      const int32_t(*cb)[16][16] = c[b & 1];
      const uint8_t* blk[2] = {w0 + b * BB + CB, w1 + b * BB + CB};
      __m512 dw[2], mw[2];
      for (int j = 0; j < 2; ++j) {
        dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j])));
        mw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j] + 32)));
      }
      for (int i = 0; i < kAmxBlockRows; ++i) {
        const float* mt = g.xm + ((r0 + i) * xnb + k0 / kXBlock) * kMeta;
        for (int j = 0; j < 2; ++j) {
          const __m512i s = _mm512_load_si512(cb[2 * (i / 16) + j][i % 16]);
          _mm512_store_ps(acc[j][i], scale_block(_mm512_load_ps(acc[j][i]), s, dw[j], mw[j], mt, B, k0));
        }
      }
    }
    const int R = int(std::min<int64_t>(kAmxBlockRows, g.M - r0));
    T* orow = out + r0 * ldo;
    if (gated) {
      store_rows<DT>(acc[0], acc[1], R, int(std::min<int64_t>(kPanel, N - unit * kPanel)), nullptr,
                     orow + unit * kPanel, ldo);
    } else {
      for (int j = 0; j < np; ++j) {
        const int64_t f0 = (p0 + j) * kPanel;
        store_rows<DT>(acc[j], nullptr, R, int(std::min<int64_t>(kPanel, N - f0)), bias ? bias + f0 : nullptr,
                       orow + f0, ldo);
      }
    }
  }
  Tiles::release();
}
template <DType DT, typename T = vec::elem_t<DT>>
void run_amx(const AmxArgs& g, int64_t N, const T* bias, bool gated, T* out, int64_t ldo) {
  const bool emulated = amx_int8_mode() == AmxMode::Emulated;
  const int64_t nitems = (g.npanels + 1) / 2 * g.nrb;
  // ~1M multiply-adds per task, as below
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, 32 * kAmxBlockRows * g.K));
  parallel_for(nitems, grain, [&](int64_t i0, int64_t i1) {
    if (emulated) amx_items<amx::I8EmuTiles, DT>(g, i0, i1, N, bias, gated, out, ldo);
    else amx_items<amx::I8HwTiles, DT>(g, i0, i1, N, bias, gated, out, ldo);
  });
}
#endif  // LLMK_AMX_TILES

// True when x of M rows runs on the AMX-INT8 tiles.
bool use_amx(int64_t M, const Layout& L) {
#if LLMK_AMX_TILES
  return M >= kAmxMinRows && L.bits == 8 && L.block == kXBlock && amx_int8_mode() != AmxMode::Off;
#else
  (void)M, (void)L;
  return false;
#endif
}

template <DType DT, typename T = vec::elem_t<DT>>
void run(const TensorView& x, const TensorView& wq, int64_t N, int id, const TensorView* bias, bool gated,
         const TensorView& out) {
  const int64_t M = x.size(0), K = x.size(1);
  const Layout L = qlayout::layout_of(id);
  const int64_t nb = K / L.block, pstride = nb * L.block_bytes();
  const bool amx = use_amx(M, L);
  // the tiles read x in blocks of 32 rows: the last block's missing rows are zeros
  const int64_t mpad = amx ? (M + 31) / 32 * 32 : M, xnb = K / kXBlock;
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xm;
  if (xq.size() < size_t(mpad * K)) xq.resize(size_t(mpad * K));
  if (xm.size() < size_t(mpad * xnb * kMeta)) xm.resize(size_t(mpad * xnb * kMeta));
  quantize_rows<DT>(x.ptr<const T>(), x.stride(0), M, K, xq.data(), xm.data());
  if (mpad > M) {
    std::memset(xq.data() + M * K, 0, size_t((mpad - M) * K));
    std::memset(xm.data() + M * xnb * kMeta, 0, size_t((mpad - M) * xnb * kMeta) * sizeof(float));
  }
  const int8_t* q = xq.data();
  const float* meta = xm.data();
  const uint8_t* w = wq.ptr<const uint8_t>();
  const T* bp = bias ? bias->ptr<const T>() : nullptr;
  T* op = out.ptr<T>();
  const int64_t panels = (N + kPanel - 1) / kPanel;
#if LLMK_AMX_TILES
  if (amx) {
    const AmxArgs g{w, pstride, nb, (gated ? 2 : 1) * panels, q, meta, K, M, mpad / kAmxBlockRows};
    return run_amx<DT>(g, N, bp, gated, op, out.stride(0));
  }
#endif
  // ~1M multiply-adds per task keeps the pool's wake-up cost small at batch 1
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, M * K));
  parallel_for(panels, grain, [&](int64_t p0, int64_t p1) {
    float a[kRows][kPanel], u[kRows][kPanel];
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int R = int(std::min<int64_t>(kRows, M - m0));
        const int8_t* xr = q + m0 * K;
        const float* mr = meta + m0 * xnb * kMeta;
        panel_rows(w + (gated ? 2 * p : p) * pstride, L, nb, xr, K, mr, R, a);
        if (gated) panel_rows(w + (2 * p + 1) * pstride, L, nb, xr, K, mr, R, u);
        store_rows<DT>(a, gated ? u : nullptr, R, int(std::min<int64_t>(kPanel, N - p * kPanel)),
                       bp ? bp + p * kPanel : nullptr, op + m0 * out.stride(0) + p * kPanel, out.stride(0));
      }
    }
  });
}

}  // namespace

bool linear_quant_vnni() {
#if defined(__AVX512F__)
  return vnni();
#else
  return false;
#endif
}

// Rows from which linear_quant runs on AMX-INT8 tiles; 0 when it never does.
int64_t linear_quant_amx_rows() {
#if LLMK_AMX_TILES
  return amx_int8_mode() != AmxMode::Off ? kAmxMinRows : 0;
#else
  return 0;
#endif
}

void linear_quant(const TensorView& x, const TensorView& weight_q, int64_t out_features, int64_t layout,
                  const TensorView* bias, bool gated, const TensorView& out, int64_t /*stream*/) {
  if (x.dtype == DType::BF16) return run<DType::BF16>(x, weight_q, out_features, int(layout), bias, gated, out);
  run<DType::F32>(x, weight_q, out_features, int(layout), bias, gated, out);
}

void quant_weight_rows(const TensorView& weight_q, int64_t layout, const TensorView& indices, const TensorView& out,
                       int64_t /*stream*/) {
  const Layout L = qlayout::layout_of(int(layout));
  const int64_t T = indices.size(0), K = out.size(1), nb = K / L.block, bb = L.block_bytes();
  const uint8_t* w = weight_q.ptr<const uint8_t>();
  const bool bf16 = out.dtype == DType::BF16;
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = ::llmk::index_at(indices, t);
      const uint8_t* pw = w + (n / kPanel) * nb * bb;
      const int f = int(n % kPanel);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = pw + b * bb;
        const float d = f16_bits_to_f32(qlayout::scale_bits(blk, L, f));
        const float m = f16_bits_to_f32(qlayout::offset_bits(blk, L, f));
        for (int k = 0; k < L.block; ++k) {
          const float v = d * float(qlayout::code_at(blk, L, f, k)) + m;
          const int64_t o = t * K + b * L.block + k;
          if (bf16) out.ptr<uint16_t>()[o] = f32_to_bf16_bits(v);
          else out.ptr<float>()[o] = v;
        }
      }
    }
  });
}

LLMK_NS_END
