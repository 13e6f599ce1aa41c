// Flash-attention forward on tensor cores (fp16/bf16, fp32 accumulation): prefill, varlen and
// paged prefill, optionally split over keys.
//
// One CTA computes a tile of kBlockM query rows for one query head (or, with GQA packing, for
// the `pack` query heads of one kv head: row R of the tile is query position R / pack of head
// R % pack, so every K/V tile staged serves all of them). Each warp owns kMT m16 row tiles.
// Key tiles of kBlockN rows are staged in shared memory by cp.async into two K and two V
// buffers (the next tile streams in while the current one is multiplied), gathered row by row
// through the block table when the cache is paged (any page size). Fragments come from
// ldmatrix; S = Q K^T and O += P V use mma.m16n8k16 with fp32 accumulators, and the online
// softmax runs on the accumulator registers. Tiles are visited from the last to the first so
// that masked tiles (causal diagonal, window edges, the ragged tail) come first; tiles no row
// can see are never loaded.
#pragma once
#include "attention/attn_device.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template <int kD_, int kBlockM_, int kBlockN_, int kWarps_, bool kQRegs_>
struct PrefillCfg {
  static constexpr int kD = kD_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr bool kQRegs = kQRegs_;  // Q fragments held in registers for the whole CTA
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMT = kBlockM / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kRowBytes = kD * 2;
  static constexpr int kSmemQ = kBlockM * kRowBytes;
  static constexpr int kSmemKV = kBlockN * kRowBytes;
  static constexpr int kSmem = kSmemQ + 4 * kSmemKV + kBlockM * 8;  // Q, K x2, V x2, row facts
  static_assert(kMT >= 1 && kBlockM == kMT * 16 * kWarps, "kBlockM must be a multiple of 16 * warps");
  static_assert(kBlockN % 16 == 0 && kD % 16 == 0 && kD >= 64, "tile shape");
};

template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) flash_prefill_kernel(const KernelArgs a) {
  constexpr int kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kMT = Cfg::kMT, kThreads = Cfg::kThreads, kRowBytes = Cfg::kRowBytes;
  constexpr int kNT = kBlockN / 8;  // n8 tiles of S
  constexpr int kDT = kD / 8;       // n8 tiles of O
  constexpr int kKS = kD / 16;      // k16 steps of Q K^T
  constexpr int kChunks = kRowBytes / 16;
  const AttnParams& p = a.p;
  LLMK_DYNAMIC_SMEM(char, smem);
  char* sQ = smem;
  char* sK = smem + Cfg::kSmemQ;
  char* sV = sK + 2 * Cfg::kSmemKV;
  int* sQi = reinterpret_cast<int*>(sV + 2 * Cfg::kSmemKV);
  float* sSlope = reinterpret_cast<float*>(sQi + kBlockM);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x % a.num_splits;
  const int m_block = a.m_blocks - 1 - int(blockIdx.x) / a.num_splits;  // long causal rows first
  const int b = a.batch0 + int(blockIdx.z);
  const SeqInfo s = seq_info(p, b);
  const int rows_total = s.seqlen_q * a.pack;
  const int row0 = m_block * kBlockM;
  if (row0 >= rows_total) return;
  const int head0 = blockIdx.y * a.pack;
  const int kvh = head0 / a.group;
  const int D = p.head_dim;
  const MaskRule rule = mask_rule(p, s);

  // Key range any row of this tile can see, then this split's part of it.
  const int last_row = (row0 + kBlockM < rows_total ? row0 + kBlockM : rows_total) - 1;
  const int i_first = row0 / a.pack, i_last = last_row / a.pack;
  const int key_lo = rule.lo(i_first), key_hi = rule.hi(i_last);
  int n_lo = key_lo / kBlockN;
  int n_hi = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_lo;
  split_range(a.num_splits, split, n_lo, n_hi);
  // Tiles inside [safe_lo, safe_hi) are visible to every row: no mask work there.
  const int safe_lo = rule.lo(i_last), safe_hi = rule.hi(i_first);

  const T* q = static_cast<const T*>(p.q);
  const char* kbase = static_cast<const char*>(p.k) + int64_t(kvh) * p.k_head_stride * int64_t(sizeof(T));
  const char* vbase = static_cast<const char*>(p.v) + int64_t(kvh) * p.v_head_stride * int64_t(sizeof(T));
  const int row_bytes = D * int(sizeof(T));

  // ---- stage Q (rows past the sequence and columns past head_dim are zero-filled) ----
  load_tile_async<kRowBytes>(
      sQ, kBlockM, rows_total - row0, row_bytes, p.q,
      [&](int r) -> const void* {
        const int R = row0 + r, i = R / a.pack, h = head0 + R % a.pack;
        return q + (s.q_row0 + i) * p.q_row_stride + int64_t(h) * p.q_head_stride;
      },
      tid, kThreads);
  auto load_k = [&](int n, int stage) {
    const int j0 = n * kBlockN;
    load_tile_async<kRowBytes>(
        sK + stage * Cfg::kSmemKV, kBlockN, s.seqlen_k - j0, row_bytes, p.k,
        [&](int r) -> const void* { return kbase + kv_row(a, s, j0 + r).k * int64_t(sizeof(T)); },
        tid, kThreads);
  };
  auto load_v = [&](int n, int stage) {
    const int j0 = n * kBlockN;
    load_tile_async<kRowBytes>(
        sV + stage * Cfg::kSmemKV, kBlockN, s.seqlen_k - j0, row_bytes, p.v,
        [&](int r) -> const void* { return vbase + kv_row(a, s, j0 + r).v * int64_t(sizeof(T)); },
        tid, kThreads);
  };
  if (n_hi > n_lo) load_k(n_hi - 1, 0);
  llmk::simt::cp_async_commit();  // group: Q + first K
  if (n_hi > n_lo) load_v(n_hi - 1, 0);
  llmk::simt::cp_async_commit();  // group: first V

  // ---- row facts (visible after the first barrier of the loop): each row's query index within
  // its sequence and its ALiBi slope * log2e ----
  const int warp_row0 = warp * kMT * 16;
  for (int r = tid; r < kBlockM; r += kThreads) {
    const int R = row0 + r;
    sQi[r] = R / a.pack;
    sSlope[r] = alibi_slope_log2(p, b, head0 + R % a.pack);
  }
  const ScoreXform xf = score_xform(p);
  const bool has_alibi = p.alibi_slopes != nullptr;

  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];
LLMK_ATTN_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
LLMK_ATTN_UNROLL
    for (int nt = 0; nt < kDT; ++nt)
LLMK_ATTN_UNROLL
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.f;
  }
  uint32_t qf[Cfg::kQRegs ? kMT : 1][Cfg::kQRegs ? kKS : 1][4];

  // ldmatrix row addresses, per lane (see the PTX fragment layouts of m16n8k16):
  //  A (Q, x4):   row (lane & 7) + 8 * ((lane >> 3) & 1), chunk + (lane >> 4)
  //  B (K, x4):   key (lane & 7) + 8 * (lane >> 4),       chunk + ((lane >> 3) & 1)
  //  B (V, x4.trans): key (lane & 7) + 8 * ((lane >> 3) & 1), chunk + (lane >> 4)
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chk = lane >> 4;
  const int k_row = (lane & 7) + 8 * (lane >> 4), k_chk = (lane >> 3) & 1;

  int stage = 0;
  for (int n = n_hi - 1; n >= n_lo; --n, stage ^= 1) {
    llmk::simt::cp_async_wait<1>();  // K tile n (and Q) landed
    __syncthreads();
    if (Cfg::kQRegs && n == n_hi - 1) {
LLMK_ATTN_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
LLMK_ATTN_UNROLL
        for (int kk = 0; kk < kKS; ++kk)
          llmk::simt::ldmatrix_x4(qf[Cfg::kQRegs ? mt : 0][Cfg::kQRegs ? kk : 0],
                                  sQ + swz<kRowBytes>(warp_row0 + mt * 16 + a_row, kk * 2 + a_chk));
    }
    if (n > n_lo) load_k(n - 1, stage ^ 1);
    llmk::simt::cp_async_commit();

    // ---- S = Q K^T ----
    float sacc[kMT][kNT][4];
LLMK_ATTN_UNROLL
    for (int mt = 0; mt < kMT; ++mt)
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
    const char* sKs = sK + stage * Cfg::kSmemKV;
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kKS; ++kk) {
      if (kk * 16 >= D) break;  // zero columns of a padded head dim
      uint32_t qa[kMT][4];
LLMK_ATTN_UNROLL
      for (int mt = 0; mt < kMT; ++mt) {
        if (Cfg::kQRegs) {
LLMK_ATTN_UNROLL
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[Cfg::kQRegs ? mt : 0][Cfg::kQRegs ? kk : 0][e];
        } else {
          llmk::simt::ldmatrix_x4(qa[mt], sQ + swz<kRowBytes>(warp_row0 + mt * 16 + a_row, kk * 2 + a_chk));
        }
      }
LLMK_ATTN_UNROLL
      for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
        uint32_t kb[4];
        llmk::simt::ldmatrix_x4(kb, sKs + swz<kRowBytes>(nt2 * 16 + k_row, kk * 2 + k_chk));
LLMK_ATTN_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          Elem<T>::mma(sacc[mt][2 * nt2], qa[mt], kb);
          Elem<T>::mma(sacc[mt][2 * nt2 + 1], qa[mt], kb + 2);
        }
      }
    }

    // ---- scores -> log2 domain, mask, online softmax ----
    const int j_base = n * kBlockN + t4 * 2;
    const bool need_mask = !(n * kBlockN >= safe_lo && (n + 1) * kBlockN <= safe_hi);
LLMK_ATTN_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
LLMK_ATTN_UNROLL
      for (int hh = 0; hh < 2; ++hh) {
        const int rloc = warp_row0 + mt * 16 + g + hh * 8;
        int qi = 0;
        float slope = 0.f;
        if (need_mask || has_alibi) {
          qi = sQi[rloc];
          slope = sSlope[rloc];
        }
        const KeyRange kr = rule.range(qi);
        float mx = m_run[mt][hh];
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            float x = xf.apply(sacc[mt][nt][hh * 2 + e]);
            const int j = j_base + nt * 8 + e;
            if (has_alibi) x += attn_alibi(slope, qi, j, rule.sq, rule.sk);
            if (need_mask && (j < kr.lo || j >= kr.hi)) x = -INFINITY;
            sacc[mt][nt][hh * 2 + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float alpha = rescale(m_run[mt][hh], mx);
        m_run[mt][hh] = mx;
        float sum = 0.f;
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float pr = exp2_shifted(sacc[mt][nt][hh * 2 + e], mx);
            sacc[mt][nt][hh * 2 + e] = pr;
            sum += pr;
          }
        l_run[mt][hh] = l_run[mt][hh] * alpha + sum;
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kDT; ++nt) {
          o[mt][nt][hh * 2] *= alpha;
          o[mt][nt][hh * 2 + 1] *= alpha;
        }
      }
    }

    llmk::simt::cp_async_wait<1>();  // V tile n landed
    __syncthreads();
    if (n > n_lo) load_v(n - 1, stage ^ 1);
    llmk::simt::cp_async_commit();

    // ---- O += P V (P re-packed from the S accumulators into A fragments) ----
    const char* sVs = sV + stage * Cfg::kSmemKV;
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kMT][4];
LLMK_ATTN_UNROLL
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = Elem<T>::pack(sacc[mt][2 * kk][0], sacc[mt][2 * kk][1]);
        pa[mt][1] = Elem<T>::pack(sacc[mt][2 * kk][2], sacc[mt][2 * kk][3]);
        pa[mt][2] = Elem<T>::pack(sacc[mt][2 * kk + 1][0], sacc[mt][2 * kk + 1][1]);
        pa[mt][3] = Elem<T>::pack(sacc[mt][2 * kk + 1][2], sacc[mt][2 * kk + 1][3]);
      }
LLMK_ATTN_UNROLL
      for (int nt2 = 0; nt2 < kDT / 2; ++nt2) {
        if (nt2 * 16 >= D) break;
        uint32_t vb[4];
        llmk::simt::ldmatrix_x4_trans(vb, sVs + swz<kRowBytes>(kk * 16 + a_row, nt2 * 2 + a_chk));
LLMK_ATTN_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          Elem<T>::mma(o[mt][2 * nt2], pa[mt], vb);
          Elem<T>::mma(o[mt][2 * nt2 + 1], pa[mt], vb + 2);
        }
      }
    }
  }

  // ---- epilogue: normalise, write O (through shared memory: 16-byte stores) and LSE ----
  llmk::simt::cp_async_wait<0>();
  __syncthreads();  // Q staging done everywhere before sQ is reused for the output
  const bool to_split = a.num_splits > 1;
  const int64_t split_rows = to_split ? total_q_rows(p) : 0;
LLMK_ATTN_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
LLMK_ATTN_UNROLL
    for (int hh = 0; hh < 2; ++hh) {
      float l = l_run[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp_row0 + mt * 16 + g + hh * 8;
      const int R = row0 + r;
      const bool valid = R < rows_total;
      const int i = R / a.pack, h = head0 + R % a.pack;
      const float lse = lse_of(m_run[mt][hh], l, to_split ? -INFINITY : INFINITY);
      if (to_split) {
        if (valid) {
          float* dst = split_out_row(p, split_rows, split, s.q_row0 + i, h);
LLMK_ATTN_UNROLL
          for (int nt = 0; nt < kDT; ++nt) {
            const int col = nt * 8 + t4 * 2;
            if (col < D) {
              dst[col] = o[mt][nt][hh * 2] * inv;
              dst[col + 1] = o[mt][nt][hh * 2 + 1] * inv;
            }
          }
          if (t4 == 0) *split_lse_at(p, split_rows, split, s.q_row0 + i, h) = lse;
        }
      } else {
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kDT; ++nt) {
          const int col = nt * 8 + t4 * 2;
          *reinterpret_cast<uint32_t*>(sQ + swz<kRowBytes>(r, col >> 3) + (col & 7) * 2) =
              Elem<T>::pack(o[mt][nt][hh * 2] * inv, o[mt][nt][hh * 2 + 1] * inv);
        }
        if (valid && p.lse && t4 == 0) *lse_at(p, b, h, i) = lse;
      }
    }
  }
  if (to_split) return;
  __syncwarp(0xffffffffu);
  T* out = static_cast<T*>(p.out);
  for (int idx = lane; idx < kMT * 16 * kChunks; idx += 32) {
    const int r = warp_row0 + idx / kChunks, c = idx % kChunks;
    const int R = row0 + r;
    if (R >= rows_total || c * 8 >= D) continue;
    const int i = R / a.pack, h = head0 + R % a.pack;
    *reinterpret_cast<uint4*>(out + (s.q_row0 + i) * p.o_row_stride + int64_t(h) * p.o_head_stride + c * 8) =
        *reinterpret_cast<const uint4*>(sQ + swz<kRowBytes>(r, c));
  }
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
