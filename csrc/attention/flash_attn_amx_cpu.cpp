// The attention GEMM tile kernel (attend_gemm: prefill, many rows) on AMX tiles, for bf16 q/k/v
// with head_dim a multiple of 32 up to 256. The tiles, the online softmax and the output are
// flash_attn_gemm_cpu.cpp's bf16 kernel's; only the two products move to tdpbf16ps
// (common/amx_tiles_cpu.h), each computed transposed so that both land in the layouts the softmax
// and the vdpbf16ps kernel already use, rows of the task in the lanes:
//   S^T [keys][rows]  = K . Q^T:  A = 16 keys x 32 d of K (rows packed contiguous, as V^T),
//                                 B = Q^T in d pairs, Qp [D/2][Mp] (packed once per task);
//   O^T [d][rows]    += V^T . P^T: A = 16 d x 32 keys of V^T (packed once per call, or per key tile),
//                                 B = P^T in key pairs, Pp [kBKA/2][Mp] (bf16, as flash-attn rounds P).
// O^T stays in memory between key tiles (each tile rescales it by the rows' alpha), and is
// transposed once into the [rows][d] output the task's store reads. Rows are padded to 32 (two B
// tiles), keys to 32 within tiles of up to 256. Where two or more tasks read a (sequence, kv
// head)'s keys, its K rows and V^T are packed once for all of them before the tasks run
// (pack_kv_amx); a task alone packs its own, tile by tile.
#include <string.h>

#include <algorithm>

#include "attention/attn_vec_cpu.h"
#include "attention/flash_attn_cpu.h"
#include "attention/flash_attn_tiles_cpu.h"
#include "common/amx_tiles_cpu.h"
#include "common/dispatch.h"
#include "common/parallel.h"

LLMK_NS_BEGIN
namespace attn {

#if LLMK_AMX_TILES
namespace {

constexpr int kBKA = 256;  // keys per tile (the vdpbf16ps kernel takes kBK)
static_assert(kBKA % 32 == 0, "a key tile is whole A tiles of 32 keys");
constexpr int64_t kPackedKvBytes = int64_t(256) << 20;  // bound on a call's packed K / V^T

// V^T [D][ld] (row stride ld) of keys j0 .. j0+nk-1 of sequence b, kv head kvh, into columns
// 0 .. nk32-1, zero from nk to nk32. A row of V^T is 16-key-pair words (key 2i low, 2i + 1 high),
// so the tile is built 16 pairs x 16 d of words at a time: two V rows interleaved into pair words
// (unpack, then restore_unpack_order), and the 16 x 16 word block transposed in registers. (Per
// element this was the kernel's largest cost.)
void pack_vt(const AttnParams& p, int b, int kvh, int j0, int nk, int nk32, int D, uint16_t* Vt, int ld) {
  for (int k0 = 0; k0 < nk32; k0 += 32) {
    const uint16_t* v[32];
    for (int jj = 0; jj < 32; ++jj)
      v[jj] = k0 + jj < nk ? kv_row<DType::BF16>(p, true, b, j0 + k0 + jj, kvh) : nullptr;
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
        _mm512_storeu_si512(Vt + int64_t(d0 + r) * ld + k0, w0[r]);
        _mm512_storeu_si512(Vt + int64_t(d0 + 16 + r) * ld + k0, w1[r]);
      }
    }
  }
}

// K rows j0 .. j0+nk-1 of sequence b, kv head kvh, contiguous [nk32][D]; rows from nk zero
void pack_k(const AttnParams& p, int b, int kvh, int j0, int nk, int nk32, int D, uint16_t* K) {
  for (int jj = 0; jj < nk; ++jj)
    memcpy(K + int64_t(jj) * D, kv_row<DType::BF16>(p, false, b, j0 + jj, kvh), size_t(D) * 2);
  if (nk32 > nk) memset(K + int64_t(nk) * D, 0, size_t(nk32 - nk) * D * 2);
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
  float* S = sc.s.get(size_t(kBKA) * Mp);
  uint32_t* Pp = reinterpret_cast<uint32_t*>(sc.k.get(size_t(kBKA / 2) * Mp));
  uint16_t* Kb = reinterpret_cast<uint16_t*>(sc.v.get(size_t(kBKA) * D));  // [kBKA][D], then V^T [D][kBKA]
  uint16_t* Vt = Kb + size_t(kBKA) * D;
  float* alpha = sc.t.get(Mp + Mp / 32);
  bool* same = reinterpret_cast<bool*>(alpha + Mp);  // per 32-row block: alpha all 1
  const Rows R = make_rows(p, t, G, Mp, sc.aux.get(4 * size_t(Mp)));

  memset(O, 0, sizeof(float) * M * D);
  for (int r = 0; r < Mp; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (R.klo >= R.khi) return;

  memset(Ot, 0, sizeof(float) * D * Mp);
  pack_q_pairs(p, t, G, M, Mp, Qp);
  const bool cvt = cpu_bf16_cvt();  // vcvtneps2bf16 (every AMX CPU has it; LLMKERN_BF16_CVT=0: not)
  const int64_t sq = int64_t(Mp) * 4;  // bytes between B rows (d pairs or key pairs) of Qp / Pp
  // K and V^T packed once for all tasks (blocks of 32 keys from key 0: K [32][D], V^T [D][32]),
  // or per tile into Kb / Vt. Packed tiles start on a block: the keys before klo that this adds
  // are outside every row's range, so the softmax masks them.
  const int64_t at = sc.kv ? sc.kv->at[size_t(t.b) * p.num_kv_heads + t.kvh] : -1;
  const uint16_t* pk = at >= 0 ? sc.kv->base + at : nullptr;
  const int64_t blk = int64_t(64) * D;
  const int vld = pk ? 32 : kBKA;  // V^T row stride
  Tiles::config();
  for (int j0 = pk ? R.klo & ~31 : R.klo; j0 < R.khi; j0 += kBKA) {
    const int nk = std::min(kBKA, R.khi - j0), nk32 = round_up(nk, 32);
    // Past nk: K rows are left as they are (their scores are never read), V^T columns are zero
    // (P is 0 there, and 0 x a stale NaN would not be): a packed last block holding keys past nk
    // is copied with those columns cleared.
    const uint16_t* vtail = nullptr;
    if (!pk) {
      pack_k(p, t.b, t.kvh, j0, nk, nk, D, Kb);
      pack_vt(p, t.b, t.kvh, j0, nk, nk32, D, Vt, kBKA);
    } else if (nk32 != nk) {
      const uint16_t* src = pk + int64_t((j0 + nk32 - 32) / 32) * blk + 32 * D;
      const __mmask32 keep = (1u << (nk - (nk32 - 32))) - 1;
      for (int d = 0; d < D; ++d) _mm512_storeu_si512(Vt + d * 32, _mm512_maskz_loadu_epi16(keep, src + d * 32));
      vtail = Vt;
    }
    // K rows from key k0 of the tile (row stride D); V^T columns from key k0 (row stride vld)
    auto krows = [&](int k0) { return pk ? pk + int64_t((j0 + k0) / 32) * blk : Kb + int64_t(k0) * D; };
    auto vcols = [&](int k0) {
      if (!pk) return static_cast<const uint16_t*>(Vt + k0);
      return vtail && k0 == nk32 - 32 ? vtail : pk + int64_t((j0 + k0) / 32) * blk + 32 * D;
    };
    // S^T = K . Q^T, 32 keys x 32 rows per block
    for (int k0 = 0; k0 < nk32; k0 += 32)
      for (int r0 = 0; r0 < Mp; r0 += 32) {
        Tiles::zero_c();
        const uint16_t* kr = krows(k0);
        for (int h = 0; h < dpairs; h += 16)
          Tiles::step(kr + 2 * h, D * 2, kr + 16 * D + 2 * h, D * 2,
                      Qp + int64_t(h) * Mp + r0, sq, Qp + int64_t(h) * Mp + r0 + 16, sq);
        Tiles::store_c(S + int64_t(k0) * Mp + r0, Mp);
      }
    // probabilities straight into P^T's bf16 key pairs (pairs past nk zero)
    // (a packed tile that starts before klo holds keys of no row: not full)
    const bool full = j0 >= R.klo && j0 >= R.full_lo && j0 + nk <= R.full_hi;
    softmax_tile_pairs(S, Mp, nk, j0, R, full, p.softcap, p.alibi_slopes != nullptr, m, l, alpha, p.softmax_scale,
                       Pp, nk32 / 2, cvt);
    // O^T = alpha O^T + V^T . P^T, 32 d x 32 rows per block, each block rescaled just before its
    // tiles load it (one pass over O^T per key tile, not two); a block whose rows' maxima all
    // stayed put (alpha exactly 1, most key tiles once the maxima settle) is left as it is
    // (the padding rows past M count as unchanged: nothing reads them)
    for (int r0 = 0; r0 < Mp; r0 += 32) {
      const uint32_t pad = M - r0 >= 32 ? 0u : ~uint32_t(0) << (M - r0);
      const __m512 one_f = _mm512_set1_ps(1.f);
      const uint32_t one = _mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + r0), one_f, _CMP_EQ_OQ) |
                           uint32_t(_mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + r0 + 16), one_f, _CMP_EQ_OQ)) << 16;
      same[r0 / 32] = (one | pad) == ~uint32_t(0);
    }
    for (int d0 = 0; d0 < D; d0 += 32)
      for (int r0 = 0; r0 < Mp; r0 += 32) {
        float* c = Ot + int64_t(d0) * Mp + r0;
        const __m512 a0 = _mm512_loadu_ps(alpha + r0), a1 = _mm512_loadu_ps(alpha + r0 + 16);
        if (!same[r0 / 32])
          for (int d = 0; d < 32; ++d) {
            float* o = c + int64_t(d) * Mp;
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), a0));
            _mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_loadu_ps(o + 16), a1));
          }
        Tiles::load_c(c, Mp);
        for (int kp = 0; kp < nk32 / 2; kp += 16) {
          const uint16_t* vt = vcols(2 * kp);
          Tiles::step(vt + d0 * vld, vld * 2, vt + (d0 + 16) * vld, vld * 2,
                      Pp + int64_t(kp) * Mp + r0, sq, Pp + int64_t(kp) * Mp + r0 + 16, sq);
        }
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

bool amx_attention(const AttnParams& p) {
#if LLMK_AMX_TILES
  return amx_mode() != AmxMode::Off && p.dtype == DType::BF16 && p.kv_quant == KvQuant::None &&
         p.head_dim % 32 == 0 && p.head_dim <= 256;
#else
  (void)p;
  return false;
#endif
}

bool attend_gemm_amx(const AttnParams& p, const Task& t, Scratch& sc) {
#if LLMK_AMX_TILES
  if (!amx_attention(p)) return false;
  if (amx_mode() == AmxMode::Emulated) gemm_amx<amx::EmuTiles>(p, t, sc);
  else gemm_amx<amx::HwTiles>(p, t, sc);
  return true;
#else
  (void)p, (void)t, (void)sc;
  return false;
#endif
}

PackedKv pack_kv_amx(const AttnParams& p, const std::vector<int>& tasks_per_pair) {
  PackedKv out;
#if LLMK_AMX_TILES
  const int Hkv = p.num_kv_heads, D = p.head_dim;
  const int64_t blk = int64_t(64) * D;
  struct Unit {
    int b, h, kb;
    int64_t at;
  };
  std::vector<Unit> units;
  std::vector<int64_t> at(tasks_per_pair.size(), -1);
  int64_t total = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < Hkv; ++h) {
      if (tasks_per_pair[size_t(b) * Hkv + h] < 2) continue;
      const int nb = (attn_seqlen_k(p, b) + 31) / 32;
      at[size_t(b) * Hkv + h] = total;
      for (int kb = 0; kb < nb; ++kb) units.push_back(Unit{b, h, kb, total + kb * blk});
      total += nb * blk;
    }
  if (total == 0 || total * 2 > kPackedKvBytes) return out;
  thread_local Buf buf;  // the calling thread's, reused from call to call (no page faults per call)
  uint16_t* base = reinterpret_cast<uint16_t*>(buf.get(size_t(total + 1) / 2));
  parallel_for(int64_t(units.size()), 4, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const Unit& w = units[u];
      const int j0 = w.kb * 32, nk = std::min(32, attn_seqlen_k(p, w.b) - j0);
      pack_k(p, w.b, w.h, j0, nk, 32, D, base + w.at);
      pack_vt(p, w.b, w.h, j0, nk, 32, D, base + w.at + 32 * D, 32);
    }
  });
  out.base = base;
  out.at = std::move(at);
#else
  (void)p, (void)tasks_per_pair;
#endif
  return out;
}

}  // namespace attn
LLMK_NS_END
