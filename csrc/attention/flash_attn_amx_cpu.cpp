// The attention GEMM tile kernel (attend_gemm: prefill, many rows) on AMX tiles, for bf16 q/k/v
// with head_dim a multiple of 32 up to 256. The tiles, the online softmax and the output are
// flash_attn_gemm_cpu.cpp's bf16 kernel's; only the two products move to tdpbf16ps
// (common/amx_tiles_cpu.h), each computed transposed so that both land in the layouts the softmax
// and the vdpbf16ps kernel already use, rows of the task in the lanes:
//   S^T [keys][rows]  = K . Q^T:  A = 16 keys x 32 d of K (the tile's rows packed contiguous),
//                                 B = Q^T in d pairs, Qp [D/2][Mp] (packed once per task);
//   O^T [d][rows]    += V^T . P^T: A = 16 d x 32 keys of V^T (packed per key tile),
//                                 B = P^T in key pairs, Pp [kBK/2][Mp] (bf16, as flash-attn rounds P).
// O^T stays in memory between key tiles (each tile rescales it by the rows' alpha), and is
// transposed once into the [rows][d] output the task's store reads. Rows are padded to 32 (two B
// tiles), keys to the tile's 64.
#include <string.h>

#include <algorithm>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"
#include "attention/flash_attn_tiles_cpu.h"
#include "common/amx_tiles_cpu.h"
#include "common/dispatch.h"

LLMK_NS_BEGIN
namespace attn {

#if LLMK_AMX_TILES
namespace {

static_assert(kBK % 32 == 0, "a key tile is whole A tiles of 32 keys");

// V^T [D][kBK] (row stride kBK) of the key tile j0 .. j0+nk-1, zero from nk to nk32. A row of V^T
// is 16-key-pair words (key 2i low, 2i + 1 high), so the tile is built 16 pairs x 16 d of words at
// a time: two V rows interleaved into pair words (unpack, then restore_unpack_order), and the
// 16 x 16 word block transposed in registers. (Per element this was the kernel's largest cost.)
void pack_vt(const AttnParams& p, const Task& t, int j0, int nk, int nk32, int D, uint16_t* Vt) {
  for (int k0 = 0; k0 < nk32; k0 += 32) {
    const uint16_t* v[32];
    for (int jj = 0; jj < 32; ++jj)
      v[jj] = k0 + jj < nk ? kv_row<DType::BF16>(p, true, t.b, j0 + k0 + jj, t.kvh) : nullptr;
    for (int d0 = 0; d0 < D; d0 += 32) {
      __m512i w0[16], w1[16];  // pair i's words of d0 .. d0+15 and d0+16 .. d0+31
      for (int i = 0; i < 16; ++i) {
        const __m512i a = v[2 * i] ? _mm512_loadu_si512(v[2 * i] + d0) : _mm512_setzero_si512();
        const __m512i b = v[2 * i + 1] ? _mm512_loadu_si512(v[2 * i + 1] + d0) : _mm512_setzero_si512();
        restore_unpack_order(_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b), w0[i], w1[i]);
      }
      transpose16_epi32(w0);
      transpose16_epi32(w1);
      for (int r = 0; r < 16; ++r) {
        _mm512_storeu_si512(Vt + int64_t(d0 + r) * kBK + k0, w0[r]);
        _mm512_storeu_si512(Vt + int64_t(d0 + 16 + r) * kBK + k0, w1[r]);
      }
    }
  }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

template <typename Tiles>
void gemm_amx(const AttnParams& p, const Task& t, Scratch& sc) {
  const int D = p.head_dim, G = p.num_heads / p.num_kv_heads;
  const int M = G * t.nq, Mp = round_up(M, 32), dpairs = D / 2;
  sc.dp = D;
  float* O = sc.o.get(size_t(M) * D);
  float* Ot = sc.ot.get(size_t(D) * Mp);
  float* m = sc.m.get(Mp);
  float* l = sc.l.get(Mp);
  uint32_t* Qp = reinterpret_cast<uint32_t*>(sc.q.get(size_t(dpairs) * Mp));
  float* S = sc.s.get(size_t(kBK) * Mp);
  uint32_t* Pp = reinterpret_cast<uint32_t*>(sc.k.get(size_t(kBK / 2) * Mp));
  uint16_t* Kb = reinterpret_cast<uint16_t*>(sc.v.get(size_t(kBK) * D));  // [kBK][D], then V^T [D][kBK]
  uint16_t* Vt = Kb + size_t(kBK) * D;
  float* alpha = sc.t.get(Mp);
  const Rows R = make_rows(p, t, G, Mp, sc.aux.get(4 * size_t(Mp)));

  memset(O, 0, sizeof(float) * M * D);
  for (int r = 0; r < Mp; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (R.klo >= R.khi) return;

  memset(Ot, 0, sizeof(float) * D * Mp);
  pack_q_pairs(p, t, G, M, Mp, Qp);
  const bool cvt = cpu_bf16_cvt();  // vcvtneps2bf16 (every AMX CPU has it; LLMKERN_BF16_CVT=0: not)
  const int64_t sq = int64_t(Mp) * 4;  // bytes between B rows (d pairs or key pairs) of Qp / Pp
  Tiles::config();
  for (int j0 = R.klo; j0 < R.khi; j0 += kBK) {
    const int nk = std::min(kBK, R.khi - j0), nk32 = round_up(nk, 32);
    // K rows contiguous and V^T. Past nk: K rows are left as they are (their scores are never read),
    // V^T columns are zero (P is 0 there, and 0 x a stale NaN would not be)
    for (int jj = 0; jj < nk; ++jj)
      memcpy(Kb + jj * D, kv_row<DType::BF16>(p, false, t.b, j0 + jj, t.kvh), size_t(D) * 2);
    pack_vt(p, t, j0, nk, nk32, D, Vt);
    // S^T = K . Q^T, 32 keys x 32 rows per block
    for (int k0 = 0; k0 < nk32; k0 += 32)
      for (int r0 = 0; r0 < Mp; r0 += 32) {
        Tiles::zero_c();
        for (int h = 0; h < dpairs; h += 16)
          Tiles::step(Kb + k0 * D + 2 * h, D * 2, Kb + (k0 + 16) * D + 2 * h, D * 2,
                      Qp + int64_t(h) * Mp + r0, sq, Qp + int64_t(h) * Mp + r0 + 16, sq);
        Tiles::store_c(S + int64_t(k0) * Mp + r0, Mp);
      }
    softmax_tile(S, Mp, nk, j0, R, j0 >= R.full_lo && j0 + nk <= R.full_hi, p.softcap,
                 p.alibi_slopes != nullptr, m, l, alpha, p.softmax_scale);
    // P^T in key pairs, bf16 (round to nearest even; vcvtneps2bf16 gives the same bits); pairs
    // past nk are zero
    for (int jp = 0; jp < nk32 / 2; ++jp) {
      uint32_t* dst = Pp + int64_t(jp) * Mp;
      const float* a = S + int64_t(2 * jp) * Mp;
      const float* b = a + Mp;
      const bool has_a = 2 * jp < nk, has_b = 2 * jp + 1 < nk;
      for (int r = 0; r < Mp; r += 16) {
        const vf va = has_a ? loadu(a + r) : splat(0.f), vb = has_b ? loadu(b + r) : splat(0.f);
        const vh ha = cvt ? to_bf16_bits_cvt(va) : to_bf16_bits(va);
        const vh hb = cvt ? to_bf16_bits_cvt(vb) : to_bf16_bits(vb);
        _mm512_storeu_si512(dst + r, bf16_pair_words(reinterpret_cast<__m256i>(ha), reinterpret_cast<__m256i>(hb)));
      }
    }
    // O^T = alpha O^T + V^T . P^T, 32 d x 32 rows per block, each block rescaled just before its
    // tiles load it (one pass over O^T per key tile, not two)
    for (int d0 = 0; d0 < D; d0 += 32)
      for (int r0 = 0; r0 < Mp; r0 += 32) {
        float* c = Ot + int64_t(d0) * Mp + r0;
        const __m512 a0 = _mm512_loadu_ps(alpha + r0), a1 = _mm512_loadu_ps(alpha + r0 + 16);
        for (int d = 0; d < 32; ++d) {
          float* o = c + int64_t(d) * Mp;
          _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), a0));
          _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_loadu_ps(o + 16), a1));
        }
        Tiles::load_c(c, Mp);
        for (int kp = 0; kp < nk32 / 2; kp += 16)
          Tiles::step(Vt + d0 * kBK + 2 * kp, kBK * 2, Vt + (d0 + 16) * kBK + 2 * kp, kBK * 2,
                      Pp + int64_t(kp) * Mp + r0, sq, Pp + int64_t(kp) * Mp + r0 + 16, sq);
        Tiles::store_c(c, Mp);
      }
  }
  Tiles::release();
  // O [M][D] = (O^T)^T, 16 x 16 blocks through registers
  for (int d0 = 0; d0 < D; d0 += 16)
    for (int r0 = 0; r0 < M; r0 += 16) {
      __m512i b[16];
      for (int i = 0; i < 16; ++i) b[i] = _mm512_loadu_si512(Ot + int64_t(d0 + i) * Mp + r0);
      transpose16_epi32(b);
      for (int j = 0; j < std::min(16, M - r0); ++j) _mm512_storeu_si512(O + int64_t(r0 + j) * D + d0, b[j]);
    }
}

#pragma GCC pop_options

}  // namespace
#endif  // LLMK_AMX_TILES

bool attend_gemm_amx(const AttnParams& p, const Task& t, Scratch& sc) {
#if LLMK_AMX_TILES
  const AmxMode mode = amx_mode();
  if (mode == AmxMode::Off || p.dtype != DType::BF16 || p.kv_quant != KvQuant::None || p.head_dim % 32 ||
      p.head_dim > 256)
    return false;
  if (mode == AmxMode::Emulated) gemm_amx<amx::EmuTiles>(p, t, sc);
  else gemm_amx<amx::HwTiles>(p, t, sc);
  return true;
#else
  (void)p, (void)t, (void)sc;
  return false;
#endif
}

}  // namespace attn
LLMK_NS_END
