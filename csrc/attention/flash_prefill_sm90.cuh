// Flash-attention prefill for sm_90a in FA3's structure (fp16/bf16, fp32 accumulation): dense
// K/V rows (varlen, dense caches) or a paged cache, softcap, ALiBi, GQA (with the query heads of
// a kv head packed into the row tile when the queries are short); no split-KV (flash_prefill.cuh).
//
// A CTA of three warpgroups computes up to 128 query rows of one head (or, packed, rows R =
// query R / pack of head R % pack: the Q box is pack heads x 128 / pack positions, so its rows
// land in that order). Warpgroup 0 is the producer: its first warp issues TMA loads of Q once
// and of K/V tiles (128 keys; 64 at head dim 256) into a two-stage ring (paged: one load per
// page slice of the tile, a lane per page resolving its block-table entry; pages past the
// sequence are not loaded and count no bytes), each stage with a "full" mbarrier (arrival +
// transaction bytes) and an "empty" one (released by the consumers after their P V); it gives
// its registers away (setmaxnreg.dec). Warpgroups 1 and 2
// are consumers of 64 rows each (setmaxnreg.inc): S = Q K^T by wgmma with both operands in
// shared memory, the online softmax on the accumulator registers, then O += P V with P from
// registers (the S accumulator layout is the A-fragment layout) and V read transposed (MN-major).
// Two named barriers make the consumers take turns issuing their GEMMs, so one warpgroup's
// softmax runs while the other's GEMMs do; inside a warpgroup, tile n's S GEMM is issued with
// tile n-1's P V, and tile n's softmax overlaps that P V. Shared tiles are TMA boxes of 64
// columns x rows with the 128-byte swizzle (the wgmma descriptors' canonical layout). Tiles are visited from the
// last to the first, masked ones first, as in flash_prefill.cuh.
#pragma once
#include <type_traits>

#include "attention/attn_device.cuh"
#include "common/simt_hopper.h"

namespace llmk {
namespace gpu {
namespace attn {

// Head dim 256 takes 64-key tiles (FA3 shrinks the tile there too): its O accumulators are 128
// registers per consumer thread, and Q plus two stages of K and V then fit in 193 KiB.
template <int kD_>
struct Sm90Cfg {
  static constexpr int kD = kD_;
  static constexpr int kBlockM = 128, kBlockN = kD > 128 ? 64 : 128, kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kCols = kD / 64;              // 64-column boxes per row (128 bytes each)
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kKVBytes = kBlockN * kD * 2;  // one K or V tile
  static constexpr int kBarBytes = 1024;             // mbarriers; keeps the tiles 1024-aligned
  static constexpr int kSmem = kBarBytes + kQBytes + 2 * kStages * kKVBytes;
  static_assert(kD % 64 == 0, "head dim in whole 64-column boxes");
};

struct Sm90Args {
  KernelArgs a;
  // q [rows, heads, D]: boxes of 64 columns x pack heads x 128 / pack rows. k, v [rows, heads, D]
  // (varlen), [batches, rows, heads, D] (p.k_batches > 0, a dense cache) or [blocks, block_size,
  // heads, D] (paged): boxes of 64 columns x 1 head x kv_box rows (x 1 batch entry or block).
  simt::TensorMap q, k, v;
  int tile_rows = 0;  // query rows of a CTA: 128 / pack * pack
  int kv_box = 0;     // key rows per K/V load: kBlockN, or the page size when smaller
};

// Page sizes the paged loads of tiles of `tile_n` keys take: a divisor of tile_n whose slices keep
// the 1024-byte alignment of the 128-byte swizzle (a multiple of 8 rows), or a multiple of tile_n.
LLMK_HD bool sm90_page_size_ok(int page, int tile_n) {
  return page > 0 && ((page < tile_n && tile_n % page == 0 && page % 8 == 0) || page % tile_n == 0);
}

// Named barriers 1, 2: consumer warpgroup c waits on 1 + c before issuing its S GEMM.
constexpr int kSchedBar = 1;

// kScores: score_mode(p) (folded: raw scores, the scale folded into exp2's FMA).
template <typename T, typename Cfg, int kScores>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flash_prefill_sm90_kernel(const __grid_constant__ Sm90Args args) {
#if defined(LLMK_SM90A) || !defined(__CUDACC__)
  constexpr bool kFold = kScores == kScoresFolded, has_alibi = kScores == kScoresAlibi;
  constexpr int kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kCols = Cfg::kCols;
  const KernelArgs& a = args.a;
  const AttnParams& p = a.p;
  LLMK_DYNAMIC_SMEM(char, smem);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* empty = v_full + kStages;
  char* sQ = smem + Cfg::kBarBytes;
  char* sK = sQ + Cfg::kQBytes;
  char* sV = sK + kStages * Cfg::kKVBytes;

  const int tid = threadIdx.x, wg = tid / 128;
  const int m_block = a.m_blocks - 1 - int(blockIdx.x);  // long causal rows first
  const int b = a.batch0 + int(blockIdx.z);
  const SeqInfo s = seq_info(p, b);
  const int pack = a.pack, tile_rows = args.tile_rows;
  const int rows_total = s.seqlen_q * pack;
  const int row0 = m_block * tile_rows;
  if (row0 >= rows_total) return;  // the whole CTA: before any barrier
  const int head0 = int(blockIdx.y) * pack, kvh = head0 / a.group;
  const MaskRule rule = mask_rule(p, s);
  const int last_row = (row0 + tile_rows < rows_total ? row0 + tile_rows : rows_total) - 1;
  const int i_first = row0 / pack, i_last = last_row / pack;
  const int key_lo = rule.lo(i_first), key_hi = rule.hi(i_last);
  const int n_lo = key_lo / kBlockN;
  const int n_hi = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_lo;
  const int safe_lo = rule.lo(i_last), safe_hi = rule.hi(i_first);
  // Key 0's coordinates: row cu_seqlens_k[b] (varlen), or cache entry + left padding; paged: the
  // block table.
  const bool paged = s.table != nullptr, batched = p.k_batches > 0;
  const int k_row0 = paged ? 0 : batched ? attn_k_row0(p, b) : p.cu_seqlens_k[b];
  const int k_entry = batched ? int(attn_cache_batch(p, b)) : 0;

  if (tid == 0) {
    simt::mbar_init(q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      simt::mbar_init(&k_full[st], 1);
      simt::mbar_init(&v_full[st], 1);
      simt::mbar_init(&empty[st], 8);  // lane 0 of each consumer warp
    }
    simt::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    simt::setmaxnreg_dec<24>();
    if (tid < 32) {
      const int lane = tid;
      if (lane == 0) {
        simt::mbar_arrive_expect_tx(q_full, kCols * tile_rows * 128);
        for (int c = 0; c < kCols; ++c)
          simt::tma_load(sQ + c * kBlockM * 128, &args.q, q_full, c * 64, head0, int(s.q_row0) + row0 / pack);
      }
      const int box = args.kv_box, loads = kBlockN / box;  // paged: page slices per tile
      int it = 0;
      for (int n = n_hi - 1; n >= n_lo; --n, ++it) {
        const int st = it % kStages, use = it / kStages;
        if (use > 0) simt::mbar_wait(&empty[st], (use - 1) & 1);
        char* dk = sK + st * Cfg::kKVBytes;
        char* dv = sV + st * Cfg::kKVBytes;
        if (paged) {
          // Slices holding a key of the sequence; the rest of the stage keeps stale rows, which the
          // consumers mask (K) and zero (V) like any row past the sequence.
          const int j0 = n * kBlockN;
          int live = (s.seqlen_k - j0 + box - 1) / box;
          live = live < loads ? live : loads;
          if (lane == 0) {
            simt::mbar_arrive_expect_tx(&k_full[st], live * box * 128 * kCols);
            simt::mbar_arrive_expect_tx(&v_full[st], live * box * 128 * kCols);
          }
          __syncwarp();
          if (lane < live) {
            const PagedRow<int> at = paged_row(s.table, a.page, p.block_size, j0 + lane * box);
            const int blk = int(at.block), slot = at.slot;
            for (int c = 0; c < kCols; ++c)
              simt::tma_load(dk + c * kBlockN * 128 + lane * box * 128, &args.k, &k_full[st], c * 64, kvh, slot, blk);
            for (int c = 0; c < kCols; ++c)
              simt::tma_load(dv + c * kBlockN * 128 + lane * box * 128, &args.v, &v_full[st], c * 64, kvh, slot, blk);
          }
        } else if (lane == 0) {
          const int key_row = k_row0 + n * kBlockN;
          auto load = [&](char* dst, const simt::TensorMap* map, uint64_t* bar) {
            simt::mbar_arrive_expect_tx(bar, Cfg::kKVBytes);
            for (int c = 0; c < kCols; ++c) {
              if (batched) simt::tma_load(dst + c * kBlockN * 128, map, bar, c * 64, kvh, key_row, k_entry);
              else simt::tma_load(dst + c * kBlockN * 128, map, bar, c * 64, kvh, key_row);
            }
          };
          load(dk, &args.k, &k_full[st]);
          load(dv, &args.v, &v_full[st]);
        }
      }
    }
    return;
  }

  // ---- consumers: warpgroup c = wg - 1 owns rows 64c .. 64c + 63 of the tile ----
  simt::setmaxnreg_inc<240>();
  const int c = wg - 1, t = tid % 128, warp = t / 32, lane = t % 32;
  const int g = lane >> 2, q4 = lane & 3;
  const ScoreXform xf = score_xform(p);
  // Exponent FMA: exp2(x * x_mul - m) with x the raw score (kFold) or the log2-domain score.
  const float x_mul = kFold ? xf.scale_log2 : 1.f;
  if (c == 1) simt::named_bar_arrive(kSchedBar, 256);  // consumer 0 goes first

  float o[kD / 2];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
LLMK_ATTN_UNROLL
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  // Rows g and g + 8 of this warp's 16: their query index, head, visible keys, key position and
  // ALiBi slope (fixed for the whole row: computed once). Rows past the tile (128 / pack * pack
  // < 128) or the sequence compute on whatever Q holds and are not written.
  int qi[2], qh[2], qpos[2];
  KeyRange kr[2];
  float slope[2];
LLMK_ATTN_UNROLL
  for (int hh = 0; hh < 2; ++hh) {
    int R = row0 + 64 * c + 16 * warp + g + 8 * hh;
    R = R < last_row ? R : last_row;
    qi[hh] = R / pack;
    qh[hh] = head0 + R % pack;
    kr[hh] = rule.range(qi[hh]);
    qpos[hh] = qi[hh] + rule.sk - rule.sq;
    slope[hh] = has_alibi ? alibi_slope_log2(p, b, qh[hh]) : 0.f;
  }

  simt::mbar_wait(q_full, 0);
  const char* sQc = sQ + 64 * c * 128;

  // Tile n's S GEMM is issued together with the previous tile's P V, so the softmax of tile n
  // runs while that P V is still in the tensor cores (FA3's intra-warpgroup overlap); the
  // accumulators are rescaled only once the P V has landed.
  float sacc[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];  // P of the previous tile as A fragments
  int prev_n = 0, prev_st = 0, prev_phase = 0;

  auto issue_pv = [&]() {
    char* sVs = sV + prev_st * Cfg::kKVBytes;
    simt::mbar_wait(&v_full[prev_st], prev_phase);
    if ((prev_n + 1) * kBlockN > s.seqlen_k) {
      // Rows past the sequence hold other sequences' keys or anything: P is 0 there, but 0 x NaN
      // is not, so they become zeros (both consumers write the same zeros, before either P V).
      const int valid = s.seqlen_k - prev_n * kBlockN;
      for (int idx = t; idx < kCols * kBlockN * 8; idx += 128) {
        const int col = idx / (kBlockN * 8), r = idx / 8 % kBlockN, chunk = idx % 8;
        if (r >= valid) *reinterpret_cast<uint4*>(sVs + col * kBlockN * 128 + r * 128 + chunk * 16) = uint4{0, 0, 0, 0};
      }
      simt::fence_proxy_async();
      simt::named_bar_sync(kSchedBar + 2 + c, 128);
    }
    simt::wgmma_fence_operand<kD / 2>(o);
    simt::wgmma_fence();
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      // V [keys][D] is B read transposed: 64-column boxes at LBO, 8-key groups at SBO.
      const uint64_t dv = simt::wgmma_desc(sVs + kk * 16 * 128, kBlockN * 128, 1024, 128);
      simt::wgmma_rs<T, kD, 1>(o, pa[kk], dv, 1);
    }
    simt::wgmma_commit();
    simt::wgmma_fence_operand<kD / 2>(o);
  };
  auto release_prev = [&]() {
    if (lane == 0) simt::mbar_arrive(&empty[prev_st]);
  };

  // kFirst: the first tile (no P V in flight), peeled so that the steady state has one shape.
  auto step = [&](int n, int it, auto mask_tag, auto first_tag) {
    constexpr bool kMask = decltype(mask_tag)::value, kFirst = decltype(first_tag)::value;
    const int st = it % kStages, phase = (it / kStages) & 1;
    const char* sKs = sK + st * Cfg::kKVBytes;
    simt::mbar_wait(&k_full[st], phase);
    // Our turn to issue: the other consumer is in its softmax meanwhile.
    simt::named_bar_sync(kSchedBar + c, 256);
    simt::wgmma_fence_operand<kBlockN / 2>(sacc);
    simt::wgmma_fence();
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int col = kk / 4, byte = (kk % 4) * 32;
      const uint64_t dq = simt::wgmma_desc(sQc + col * kBlockM * 128 + byte, 16, 1024, 128);
      const uint64_t dk = simt::wgmma_desc(sKs + col * kBlockN * 128 + byte, 16, 1024, 128);
      simt::wgmma_ss<T, kBlockN, 0>(sacc, dq, dk, kk > 0);
    }
    simt::wgmma_commit();
    simt::wgmma_fence_operand<kBlockN / 2>(sacc);
    if (!kFirst) issue_pv();
    simt::named_bar_arrive(kSchedBar + (1 - c), 256);
    if (!kFirst) simt::wgmma_wait<1>();  // S landed; the P V may still run
    else simt::wgmma_wait<0>();
    simt::wgmma_fence_operand<kBlockN / 2>(sacc);

    // ---- mask, online softmax (raw scores; rows g and g + 8 of this warp's 16) ----
    const int j_base = n * kBlockN + 2 * q4;
    float alpha[2];
LLMK_ATTN_UNROLL
    for (int hh = 0; hh < 2; ++hh) {
      const float dist0 = float(qpos[hh] - j_base);  // ALiBi distance to key j_base
      float mx = -INFINITY;
LLMK_ATTN_UNROLL
      for (int i = 0; i < kBlockN / 8; ++i)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          float x = sacc[4 * i + 2 * hh + e];
          const int j = j_base + 8 * i + e;
          if (!kFold) x = unfolded_score(xf, x, has_alibi, slope[hh], dist0 - float(8 * i + e));
          if (kMask && (j < kr[hh].lo || j >= kr[hh].hi)) x = -INFINITY;
          sacc[4 * i + 2 * hh + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hh], mx * x_mul);
      alpha[hh] = rescale(m_run[hh], m_new);
      m_run[hh] = m_new;
      const float base = attn_exp_base(m_new);
      float sum = 0.f;
LLMK_ATTN_UNROLL
      for (int i = 0; i < kBlockN / 8; ++i)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          const float pr = exp2f(fmaf(sacc[4 * i + 2 * hh + e], x_mul, -base));
          sacc[4 * i + 2 * hh + e] = pr;
          sum += pr;
        }
      l_run[hh] = l_run[hh] * alpha[hh] + sum;
    }
    if (!kFirst) {
      simt::wgmma_wait<0>();  // the previous tile's P V landed: its stage is free, O can be rescaled
      simt::wgmma_fence_operand<kD / 2>(o);
      release_prev();
    }
LLMK_ATTN_UNROLL
    for (int i = 0; i < kD / 8; ++i) {
      o[4 * i] *= alpha[0];
      o[4 * i + 1] *= alpha[0];
      o[4 * i + 2] *= alpha[1];
      o[4 * i + 3] *= alpha[1];
    }
    // P as A fragments of the k16 steps over this tile's keys.
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = Elem<T>::pack(sacc[8 * kk + 0], sacc[8 * kk + 1]);
      pa[kk][1] = Elem<T>::pack(sacc[8 * kk + 2], sacc[8 * kk + 3]);
      pa[kk][2] = Elem<T>::pack(sacc[8 * kk + 4], sacc[8 * kk + 5]);
      pa[kk][3] = Elem<T>::pack(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
    prev_n = n, prev_st = st, prev_phase = phase;
  };

  auto masked = [&](int n) { return !(n * kBlockN >= safe_lo && (n + 1) * kBlockN <= safe_hi); };
  int n = n_hi - 1, it = 0;
  if (n >= n_lo) {
    if (masked(n)) step(n, it, std::true_type(), std::true_type());
    else step(n, it, std::false_type(), std::true_type());
    --n, ++it;
  }
LLMK_ATTN_NO_UNROLL
  while (n >= n_lo) {
LLMK_ATTN_NO_UNROLL
    for (; n >= n_lo && masked(n); --n, ++it) step(n, it, std::true_type(), std::false_type());
LLMK_ATTN_NO_UNROLL
    for (; n >= n_lo && !masked(n); --n, ++it) step(n, it, std::false_type(), std::false_type());
  }
  if (it > 0) {  // the last tile's P V
    issue_pv();
    simt::wgmma_wait<0>();
    release_prev();
  }

  // ---- epilogue: normalise and write O (pairs of columns per thread) and the LSE ----
  T* out = static_cast<T*>(p.out);
LLMK_ATTN_UNROLL
  for (int hh = 0; hh < 2; ++hh) {
    float l = l_run[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row0 + 64 * c + 16 * warp + g + 8 * hh > last_row) continue;  // last_row < row0 + tile_rows
    const int i = qi[hh], h = qh[hh];
    T* dst = out + (s.q_row0 + i) * p.o_row_stride + int64_t(h) * p.o_head_stride;
LLMK_ATTN_UNROLL
    for (int k = 0; k < kD / 8; ++k) {
      const int col = 8 * k + 2 * q4;
      if (col < p.head_dim)
        *reinterpret_cast<uint32_t*>(dst + col) = Elem<T>::pack(o[4 * k + 2 * hh] * inv, o[4 * k + 2 * hh + 1] * inv);
    }
    if (p.lse && q4 == 0) *lse_at(p, b, h, i) = lse_of(m_run[hh], l, INFINITY);
  }
#endif
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
