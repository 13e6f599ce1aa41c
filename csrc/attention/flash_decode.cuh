// Decode-shaped attention (few query rows per kv head, long contexts): paged or dense KV cache,
// split-KV across CTAs ("flash-decoding") and across the warps of a CTA.
//
// One CTA serves one kv head of one sequence: its 16 rows are the (query position, head) pairs
// of the Hq/Hkv query heads that share that kv head, so each K/V byte is loaded once for the
// whole group. (More than 16 such rows -> several row tiles.) The CTA's key range (one split of
// the sequence) is cut into tiles of kWarpN keys dealt round-robin to 4 warps; each warp runs
// its own cp.async pipeline (16-byte copies, kStages deep, no CTA barrier inside the loop) and
// its own online softmax. At the end the 4 partial states are merged through shared memory and
// written either as the final output or as this split's partial result for the combine kernel.
// The block-table entries of the CTA's key range are staged in shared memory up front.
//
// The per-tile math is a policy: MmaTile (fp16/bf16, mma.m16n8k16 + ldmatrix) or FmaTile
// (fp32, CUDA cores; also serves fp32 prefill).
#pragma once
#include "attention/attn_device.cuh"
#include "attention/flash_launch.h"

namespace llmk {
namespace gpu {
namespace attn {

constexpr int kTableCap = 1024;     // block-table entries staged in shared memory

// Row stride (floats) of the warps' partial outputs in the merge buffer: 8 floats of padding make
// a row start 32 bytes further along the banks than the previous one, so the float2 stores of a
// half-warp (4 rows x 4 lanes x 8 bytes) hit 32 different banks.
constexpr int merge_stride(int d) { return d + 8; }

// Row facts shared by the warps: each row's query index in its sequence and its ALiBi slope.
struct RowFacts {
  int qi[kDecodeRows];
  float slope[kDecodeRows];
};

struct TileMask {
  bool need;  // false: every row sees every key of the tile
  MaskRule rule;
  bool alibi;
};

// ---- fp16 / bf16: tensor cores -----------------------------------------------------------------
template <typename T, int kD>
struct MmaTile {
  static constexpr int kElem = 2;
  static constexpr int kWarpN = 16;  // keys per warp tile: one k16 step of P V
  static constexpr bool kNeedP = false;  // P stays in registers
  static constexpr int kRowBytes = kD * kElem;
  static constexpr int kDT = kD / 8, kKS = kD / 16;
  static constexpr bool kQRegs = kD <= 128;

  uint32_t qf[kQRegs ? kKS : 1][4];
  float o[kDT][4];
  float m[2], l[2];
  int qi[2];
  float slope[2];

  LLMK_DEVICE void init(const char* sQ, const RowFacts& rf, int lane) {
    for (int nt = 0; nt < kDT; ++nt)
      for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
    for (int hh = 0; hh < 2; ++hh) {
      m[hh] = -INFINITY;
      l[hh] = 0.f;
      qi[hh] = rf.qi[(lane >> 2) + 8 * hh];
      slope[hh] = rf.slope[(lane >> 2) + 8 * hh];
    }
    if (kQRegs) {
      const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chk = lane >> 4;
LLMK_ATTN_UNROLL
      for (int kk = 0; kk < kKS; ++kk)
        llmk::simt::ldmatrix_x4(qf[kQRegs ? kk : 0], sQ + swz<kRowBytes>(a_row, kk * 2 + a_chk));
    }
  }

  LLMK_DEVICE void tile(const char* sQ, const char* sK, const char* sV, int j0, int D,
                        const ScoreXform& xf, const TileMask& mk, float* /*sP*/, int lane) {
    const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chk = lane >> 4;
    const int k_row = (lane & 7) + 8 * (lane >> 4), k_chk = (lane >> 3) & 1;
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kKS; ++kk) {
      if (kk * 16 >= D) break;
      uint32_t qa[4];
      if (kQRegs) {
LLMK_ATTN_UNROLL
        for (int e = 0; e < 4; ++e) qa[e] = qf[kQRegs ? kk : 0][e];
      } else {
        llmk::simt::ldmatrix_x4(qa, sQ + swz<kRowBytes>(a_row, kk * 2 + a_chk));
      }
      uint32_t kb[4];
      llmk::simt::ldmatrix_x4(kb, sK + swz<kRowBytes>(k_row, kk * 2 + k_chk));
      Elem<T>::mma(s[0], qa, kb);
      Elem<T>::mma(s[1], qa, kb + 2);
    }
    const int jb = j0 + (lane & 3) * 2;
LLMK_ATTN_UNROLL
    for (int hh = 0; hh < 2; ++hh) {
      const KeyRange kr = mk.rule.range(qi[hh]);
      float mx = m[hh];
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < 2; ++nt)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          float x = xf.apply(s[nt][hh * 2 + e]);
          const int j = jb + nt * 8 + e;
          if (mk.alibi) x += attn_alibi(slope[hh], qi[hh], j, mk.rule.sq, mk.rule.sk);
          if (mk.need && (j < kr.lo || j >= kr.hi)) x = -INFINITY;
          s[nt][hh * 2 + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float alpha = rescale(m[hh], mx);
      m[hh] = mx;
      float sum = 0.f;
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < 2; ++nt)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          const float pr = exp2_shifted(s[nt][hh * 2 + e], mx);
          s[nt][hh * 2 + e] = pr;
          sum += pr;
        }
      l[hh] = l[hh] * alpha + sum;
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < kDT; ++nt) {
        o[nt][hh * 2] *= alpha;
        o[nt][hh * 2 + 1] *= alpha;
      }
    }
    uint32_t pa[4] = {Elem<T>::pack(s[0][0], s[0][1]), Elem<T>::pack(s[0][2], s[0][3]),
                      Elem<T>::pack(s[1][0], s[1][1]), Elem<T>::pack(s[1][2], s[1][3])};
LLMK_ATTN_UNROLL
    for (int nt2 = 0; nt2 < kDT / 2; ++nt2) {
      if (nt2 * 16 >= D) break;
      uint32_t vb[4];
      llmk::simt::ldmatrix_x4_trans(vb, sV + swz<kRowBytes>(a_row, nt2 * 2 + a_chk));
      Elem<T>::mma(o[2 * nt2], pa, vb);
      Elem<T>::mma(o[2 * nt2 + 1], pa, vb + 2);
    }
  }

  // Unnormalised O into sO [16][merge_stride(kD)] (float) and (max, sum) per row into sML [16][2].
  LLMK_DEVICE void dump(float* sO, float* sML, int lane) {
    constexpr int kOS = merge_stride(kD);
    const int g = lane >> 2, t4 = lane & 3;
LLMK_ATTN_UNROLL
    for (int hh = 0; hh < 2; ++hh) {
      float lsum = l[hh];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const int r = g + 8 * hh;
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < kDT; ++nt)
        *reinterpret_cast<float2*>(sO + r * kOS + nt * 8 + t4 * 2) = make_float2(o[nt][hh * 2], o[nt][hh * 2 + 1]);
      if (t4 == 0) {
        sML[r * 2] = m[hh];
        sML[r * 2 + 1] = lsum;
      }
    }
  }
};

// ---- fp32: CUDA cores -----------------------------------------------------------------------
// Q K^T: lane = (key lane % kWarpN, part lane / kWarpN) sums every parts-th 4-float chunk of
// the key's row for all 16 rows, then the parts are added by shuffles. P V: lane owns 4-float
// output chunks (lane, lane + 32, ...) of all 16 rows; P comes from a per-warp shared buffer.
template <int kD>
struct FmaTile {
  static constexpr int kElem = 4;
  static constexpr int kWarpN = kD <= 128 ? 16 : 8;
  static constexpr bool kNeedP = true;  // P goes through a per-warp shared buffer
  static constexpr int kParts = 32 / kWarpN;
  static constexpr int kRowBytes = kD * kElem;
  static constexpr int kChunks = kD / 4;
  static constexpr int kOC = (kChunks + 31) / 32;  // output chunks per lane
  static constexpr int kR = kDecodeRows;

  float4 o[kR][kOC];
  float m[kR], l[kR];
  const RowFacts* rf;

  LLMK_DEVICE void init(const char*, const RowFacts& facts, int) {
    rf = &facts;
    for (int r = 0; r < kR; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
      for (int c = 0; c < kOC; ++c) o[r][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  LLMK_DEVICE void tile(const char* sQ, const char* sK, const char* sV, int j0, int D,
                        const ScoreXform& xf, const TileMask& mk, float* sP, int lane) {
    const int key = lane % kWarpN, part = lane / kWarpN;
    float s[kR];
LLMK_ATTN_UNROLL
    for (int r = 0; r < kR; ++r) s[r] = 0.f;
    for (int c = part; c < kChunks && c * 4 < D; c += kParts) {
      const float4 k4 = *reinterpret_cast<const float4*>(sK + swz<kRowBytes>(key, c));
LLMK_ATTN_UNROLL
      for (int r = 0; r < kR; ++r) {
        const float4 q4 = *reinterpret_cast<const float4*>(sQ + swz<kRowBytes>(r, c));
        s[r] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
      }
    }
LLMK_ATTN_UNROLL
    for (int off = kWarpN; off < 32; off <<= 1)
LLMK_ATTN_UNROLL
      for (int r = 0; r < kR; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], off);
    const int j = j0 + key;
    float alpha[kR];
LLMK_ATTN_UNROLL
    for (int r = 0; r < kR; ++r) {
      const int qi = rf->qi[r];
      float x = xf.apply(s[r]);
      if (mk.alibi) x += attn_alibi(rf->slope[r], qi, j, mk.rule.sq, mk.rule.sk);
      if (mk.need) {
        const KeyRange kr = mk.rule.range(qi);
        if (j < kr.lo || j >= kr.hi) x = -INFINITY;
      }
      float mx = x;
LLMK_ATTN_UNROLL
      for (int off = 1; off < kWarpN; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      mx = fmaxf(mx, m[r]);
      alpha[r] = rescale(m[r], mx);
      m[r] = mx;
      const float pr = exp2_shifted(x, mx);
      l[r] = l[r] * alpha[r] + (part == 0 ? pr : 0.f);
      if (part == 0) sP[r * kWarpN + key] = pr;
    }
    __syncwarp(0xffffffffu);
LLMK_ATTN_UNROLL
    for (int c = 0; c < kOC; ++c) {
      const int ch = lane + 32 * c;
      if (ch >= kChunks || ch * 4 >= D) continue;
LLMK_ATTN_UNROLL
      for (int r = 0; r < kR; ++r) {
        o[r][c].x *= alpha[r];
        o[r][c].y *= alpha[r];
        o[r][c].z *= alpha[r];
        o[r][c].w *= alpha[r];
      }
      for (int k = 0; k < kWarpN; ++k) {
        const float4 v4 = *reinterpret_cast<const float4*>(sV + swz<kRowBytes>(k, ch));
LLMK_ATTN_UNROLL
        for (int r = 0; r < kR; ++r) {
          const float pr = sP[r * kWarpN + k];
          o[r][c].x += pr * v4.x;
          o[r][c].y += pr * v4.y;
          o[r][c].z += pr * v4.z;
          o[r][c].w += pr * v4.w;
        }
      }
    }
    __syncwarp(0xffffffffu);  // sP is rewritten by the next tile
  }

  LLMK_DEVICE void dump(float* sO, float* sML, int lane) {
LLMK_ATTN_UNROLL
    for (int r = 0; r < kR; ++r) {
      float lsum = l[r];
LLMK_ATTN_UNROLL
      for (int off = 1; off < 32; off <<= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);
LLMK_ATTN_UNROLL
      for (int c = 0; c < kOC; ++c) {
        const int ch = lane + 32 * c;
        if (ch < kChunks) *reinterpret_cast<float4*>(sO + r * merge_stride(kD) + ch * 4) = o[r][c];
      }
      if (lane == 0) {
        sML[r * 2] = m[r];
        sML[r * 2 + 1] = lsum;
      }
    }
  }
};

// Four consecutive outputs in one store (8 bytes for fp16/bf16, 16 for fp32).
template <typename T>
LLMK_DEVICE void store4(T* dst, float4 v) {
  const uint2 u = make_uint2(Elem<T>::pack(v.x, v.y), Elem<T>::pack(v.z, v.w));
  *reinterpret_cast<uint2*>(dst) = u;
}
template <>
LLMK_DEVICE void store4<float>(float* dst, float4 v) {
  *reinterpret_cast<float4*>(dst) = v;
}

// The sequence's block-table row as paged_row reads it: pages [page0, page0 + kTableCap) from
// the copy in shared memory when the split's pages fit there, else from global memory.
struct DecodeTable {
  const int32_t* smem;
  const int32_t* global;
  int page0;
  bool in_smem;
  LLMK_DEVICE int32_t operator[](int page) const { return in_smem ? smem[page - page0] : global[page]; }
};

// ---- the kernel skeleton ---------------------------------------------------------------------
template <typename Tile, int kStages>
struct DecodeCfg {
  static constexpr int kThreads = kDecodeWarps * 32;
  static constexpr int kRowBytes = Tile::kRowBytes;
  static constexpr int kTileBytes = Tile::kWarpN * kRowBytes;        // one K or V tile
  static constexpr int kWarpStage = 2 * kTileBytes;                   // K + V
  static constexpr int kSmemQ = kDecodeRows * kRowBytes;
  static constexpr int kSmemStages = kDecodeWarps * kStages * kWarpStage;
  static constexpr int kSmemMerge = kDecodeWarps * kDecodeRows * merge_stride(Tile::kRowBytes / Tile::kElem) * 4 +
                                    kDecodeWarps * kDecodeRows * 2 * 4;
  static constexpr int kSmemBig = kSmemStages > kSmemMerge ? kSmemStages : kSmemMerge;
  static constexpr int kSmemP = Tile::kNeedP ? kDecodeWarps * kDecodeRows * Tile::kWarpN * 4 : 0;
  static constexpr int kSmemRowOff = kDecodeWarps * Tile::kWarpN * 16;  // (K, V) offsets per row
  static constexpr int kSmem = kSmemQ + kSmemBig + kSmemP + kSmemRowOff + kTableCap * 4 +
                               int(sizeof(RowFacts));
};

template <typename T, typename Tile, int kStages>
__global__ void __launch_bounds__(kDecodeWarps * 32) flash_decode_kernel(const KernelArgs a) {
  using Cfg = DecodeCfg<Tile, kStages>;
  constexpr int kD = Tile::kRowBytes / Tile::kElem;
  constexpr int kWarpN = Tile::kWarpN;
  constexpr int kRowBytes = Cfg::kRowBytes;
  const AttnParams& p = a.p;
  LLMK_DYNAMIC_SMEM(char, smem);
  char* sQ = smem;
  char* sBig = sQ + Cfg::kSmemQ;
  float* sPall = reinterpret_cast<float*>(sBig + Cfg::kSmemBig);
  int64_t* sRowOff = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(sPall) + Cfg::kSmemP);
  int32_t* sTable = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(sRowOff) + Cfg::kSmemRowOff);
  RowFacts* sFacts = reinterpret_cast<RowFacts*>(sTable + kTableCap);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x % a.num_splits;
  const int rt = int(blockIdx.x) / a.num_splits;
  const int kvh = blockIdx.y, b = a.batch0 + int(blockIdx.z);
  const SeqInfo s = seq_info(p, b);
  const int rows_total = s.seqlen_q * a.group;
  const int row0 = rt * kDecodeRows;
  if (row0 >= rows_total) return;
  const int rows = rows_total - row0 < kDecodeRows ? rows_total - row0 : kDecodeRows;
  const int head0 = kvh * a.group;
  const int D = p.head_dim;
  const MaskRule rule = mask_rule(p, s);
  const int i_first = row0 / a.group, i_last = (row0 + rows - 1) / a.group;
  const int key_lo = rule.lo(i_first), key_hi = rule.hi(i_last);
  int n_lo = key_lo / kWarpN;
  int n_hi = key_hi > key_lo ? (key_hi + kWarpN - 1) / kWarpN : n_lo;
  split_range(a.num_splits, split, n_lo, n_hi);
  const int safe_lo = rule.lo(i_last), safe_hi = rule.hi(i_first);

  // ---- Q rows (zero past `rows` and past head_dim), row facts, block-table slice ----
  const char* q = static_cast<const char*>(p.q);
  load_tile_async<kRowBytes>(
      sQ, kDecodeRows, rows, D * Tile::kElem, p.q,
      [&](int r) -> const void* {
        const int R = row0 + r, i = R / a.group, h = head0 + R % a.group;
        return q + ((s.q_row0 + i) * p.q_row_stride + int64_t(h) * p.q_head_stride) * Tile::kElem;
      },
      tid, Cfg::kThreads);
  llmk::simt::cp_async_commit();
  if (tid < kDecodeRows) {
    const int R = row0 + tid;
    sFacts->qi[tid] = R / a.group;
    sFacts->slope[tid] = alibi_slope_log2(p, b, head0 + R % a.group);
  }
  const int key_end = n_hi * kWarpN < s.seqlen_k ? n_hi * kWarpN : s.seqlen_k;
  const int page0 = s.table && n_hi > n_lo ? a.page.div(n_lo * kWarpN) : 0;
  const int pages = s.table && n_hi > n_lo ? a.page.div(key_end - 1) - page0 + 1 : 0;
  const bool table_in_smem = pages <= kTableCap;
  if (table_in_smem)
    for (int e = tid; e < pages; e += Cfg::kThreads) sTable[e] = s.table[page0 + e];
  __syncthreads();
  const DecodeTable table{sTable, s.table, page0, table_in_smem};

  const char* kbase = static_cast<const char*>(p.k) + int64_t(kvh) * p.k_head_stride * Tile::kElem;
  const char* vbase = static_cast<const char*>(p.v) + int64_t(kvh) * p.v_head_stride * Tile::kElem;
  char* my_stages = sBig + warp * kStages * Cfg::kWarpStage;
  int64_t* my_off = sRowOff + warp * kWarpN * 2;
  // Issue the copies of tile n (kWarpN keys) into stage st: lanes < kWarpN resolve one key's
  // (K, V) row offsets each, then the warp copies 16-byte chunks.
  auto issue = [&](int n, int st) {
    const int j0 = n * kWarpN;
    __syncwarp(0xffffffffu);
    if (lane < kWarpN) {
      const int j = j0 + lane < s.seqlen_k ? j0 + lane : s.seqlen_k - 1;
      int64_t ko, vo;
      if (s.table) {
        const KvOffsets o = paged_kv_offsets(p, table, a.page, j);
        ko = o.k;
        vo = o.v;
      } else {
        ko = s.k_base + int64_t(j) * p.k_row_stride;
        vo = s.v_base + int64_t(j) * p.v_row_stride;
      }
      my_off[lane * 2] = ko * Tile::kElem;
      my_off[lane * 2 + 1] = vo * Tile::kElem;
    }
    __syncwarp(0xffffffffu);
    char* st_k = my_stages + st * Cfg::kWarpStage;
    const int valid = s.seqlen_k - j0;
    load_tile_async<kRowBytes>(st_k, kWarpN, valid, D * Tile::kElem, p.k,
                               [&](int r) -> const void* { return kbase + my_off[r * 2]; }, lane, 32);
    load_tile_async<kRowBytes>(st_k + Cfg::kTileBytes, kWarpN, valid, D * Tile::kElem, p.v,
                               [&](int r) -> const void* { return vbase + my_off[r * 2 + 1]; }, lane, 32);
  };

  // ---- per-warp pipeline over tiles n_lo + warp, n_lo + warp + 4, ... ----
  const int my_first = n_lo + warp;
  const int my_count = n_hi > my_first ? (n_hi - my_first + kDecodeWarps - 1) / kDecodeWarps : 0;
LLMK_ATTN_UNROLL
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < my_count) issue(my_first + st * kDecodeWarps, st);
    llmk::simt::cp_async_commit();
  }
  llmk::simt::cp_async_wait<kStages - 1>();  // this thread's Q copies landed
  __syncthreads();                            // ... and everyone's

  Tile tile;
  tile.init(sQ, *sFacts, lane);
  const ScoreXform xf = score_xform(p);
  TileMask mk;
  mk.rule = rule;
  mk.alibi = p.alibi_slopes != nullptr;
  float* sP = sPall + warp * kDecodeRows * kWarpN;
  for (int k = 0; k < my_count; ++k) {
    const int ahead = k + kStages - 1;
    if (ahead < my_count) issue(my_first + ahead * kDecodeWarps, ahead % kStages);
    llmk::simt::cp_async_commit();
    llmk::simt::cp_async_wait<kStages - 1>();
    __syncwarp(0xffffffffu);
    const int n = my_first + k * kDecodeWarps;
    const char* st_k = my_stages + (k % kStages) * Cfg::kWarpStage;
    mk.need = !(n * kWarpN >= safe_lo && (n + 1) * kWarpN <= safe_hi);
    tile.tile(sQ, st_k, st_k + Cfg::kTileBytes, n * kWarpN, D, xf, mk, sP, lane);
  }
  llmk::simt::cp_async_wait<0>();
  __syncthreads();  // every warp is done with its stages: reuse them for the merge

  // ---- merge the warps' states ----
  constexpr int kOS = merge_stride(kD);
  float* sO = reinterpret_cast<float*>(sBig);
  float* sML = sO + kDecodeWarps * kDecodeRows * kOS;
  tile.dump(sO + warp * kDecodeRows * kOS, sML + warp * kDecodeRows * 2, lane);
  __syncthreads();

  // 8 threads per row, each 4 consecutive columns of every 32: a quarter-warp reads 128
  // contiguous bytes of one row (float4, no bank conflict) and writes 4 outputs at once.
  constexpr int kPerRow = Cfg::kThreads / kDecodeRows;
  static_assert(kPerRow == 8 && kD % 32 == 0, "merge layout");
  const int r = tid / kPerRow, part = tid % kPerRow;
  if (r >= rows) return;
  float mw[kDecodeWarps], M = -INFINITY;
LLMK_ATTN_UNROLL
  for (int w = 0; w < kDecodeWarps; ++w) {
    mw[w] = sML[(w * kDecodeRows + r) * 2];
    M = fmaxf(M, mw[w]);
  }
  float L = 0.f;
LLMK_ATTN_UNROLL
  for (int w = 0; w < kDecodeWarps; ++w) {
    mw[w] = mw[w] == -INFINITY ? 0.f : exp2f(mw[w] - M);  // now the warp's weight
    L += mw[w] * sML[(w * kDecodeRows + r) * 2 + 1];
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  const int R = row0 + r, i = R / a.group, h = head0 + R % a.group;
  const float lse = lse_of(M, L, a.num_splits > 1 ? -INFINITY : INFINITY);
  auto merged = [&](int c) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
LLMK_ATTN_UNROLL
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(sO + (w * kDecodeRows + r) * kOS + c);
      acc.x += mw[w] * x.x;
      acc.y += mw[w] * x.y;
      acc.z += mw[w] * x.z;
      acc.w += mw[w] * x.w;
    }
    return make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  };
  if (a.num_splits > 1) {
    const int64_t split_rows = total_q_rows(p);
    float* dst = split_out_row(p, split_rows, split, s.q_row0 + i, h);
LLMK_ATTN_UNROLL
    for (int c = part * 4; c < kD; c += 32)
      if (c < D) *reinterpret_cast<float4*>(dst + c) = merged(c);  // D % 8 == 0: 4 columns fit
    if (part == 0) *split_lse_at(p, split_rows, split, s.q_row0 + i, h) = lse;
  } else {
    T* dst = static_cast<T*>(p.out) + (s.q_row0 + i) * p.o_row_stride + int64_t(h) * p.o_head_stride;
LLMK_ATTN_UNROLL
    for (int c = part * 4; c < kD; c += 32) {
      if (c >= D) continue;
      const float4 v = merged(c);
      store4(dst + c, v);
    }
    if (part == 0 && p.lse) *lse_at(p, b, h, i) = lse;
  }
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
