// Flash-attention forward on tensor cores (fp16/bf16, fp32 accumulation): prefill, varlen and
// paged prefill, optionally split over keys.
//
// One CTA computes a tile of kBlockM query rows for one query head (or, with GQA packing, for
// the `pack` query heads of one kv head: row R of the tile is query position R / pack of head
// R % pack, so every K/V tile staged serves all of them). Each warp owns kMT m16 row tiles.
// Key tiles of kBlockN rows are staged in shared memory by cp.async into two K and two V
// buffers (the next tile streams in while the current one is multiplied). Each thread copies
// one fixed 16-byte column chunk of every (kThreads / chunks)-th row, so a tile's source
// addresses are one base plus constant steps (dense K/V), or, paged (a template parameter),
// one shared-memory offset per key row that kBlockN threads resolve through the block table
// (any page size) two tiles ahead, shared by the K and the V copy. Fragments come from
// ldmatrix, loaded one k-step ahead of the mma.m16n8k16 that use them (fp32 accumulators);
// the online softmax runs on the accumulator registers, with the softmax scale folded into the
// exponent's FMA when there is no softcap / ALiBi. Tiles are visited from the last to the first
// so that masked tiles (causal diagonal, window edges, the ragged tail) come first, in their
// own instantiation of the tile step; tiles no row can see are never loaded.
#pragma once
#include <type_traits>

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
  static constexpr int kChunks = kRowBytes / 16;          // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the CTA copies
  static constexpr int kSmemQ = kBlockM * kRowBytes;
  static constexpr int kSmemKV = kBlockN * kRowBytes;
  static constexpr int kSmemOff = 2 * kBlockN * 16;  // paged: (K, V) byte offsets per key row, x2
  static constexpr int kSmem = kSmemQ + 4 * kSmemKV + kSmemOff + kBlockM * 8;  // + row facts
  static_assert(kMT >= 1 && kBlockM == kMT * 16 * kWarps, "kBlockM must be a multiple of 16 * warps");
  static_assert(kBlockN % 16 == 0 && kD % 16 == 0 && kD >= 64, "tile shape");
  static_assert(kThreads % kChunks == 0 && kBlockN % kRowsPerPass == 0 && kBlockN <= kThreads,
                "copy layout: whole rows per pass, whole passes per tile, one thread per key row");
};

// kPaged: K/V rows through the block table. kScores: score_mode(p).
template <typename T, typename Cfg, bool kPaged, int kScores>
__global__ void __launch_bounds__(Cfg::kThreads) flash_prefill_kernel(const KernelArgs a) {
  constexpr bool kFold = kScores == kScoresFolded, has_alibi = kScores == kScoresAlibi;
  constexpr int kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kMT = Cfg::kMT, kThreads = Cfg::kThreads, kRowBytes = Cfg::kRowBytes;
  constexpr int kNT = kBlockN / 8;  // n8 tiles of S
  constexpr int kDT = kD / 8;       // n8 tiles of O
  constexpr int kKS = kD / 16;      // k16 steps of Q K^T
  constexpr int kChunks = Cfg::kChunks, kRowsPerPass = Cfg::kRowsPerPass;
  constexpr int kPasses = kBlockN / kRowsPerPass;
  const AttnParams& p = a.p;
  LLMK_DYNAMIC_SMEM(char, smem);
  char* sQ = smem;
  char* sK = smem + Cfg::kSmemQ;
  char* sV = sK + 2 * Cfg::kSmemKV;
  int64_t* sOff = reinterpret_cast<int64_t*>(sV + 2 * Cfg::kSmemKV);  // [2][kBlockN][K, V]
  int* sQi = reinterpret_cast<int*>(reinterpret_cast<char*>(sOff) + Cfg::kSmemOff);
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

  // ---- K/V tile copies: this thread's chunk and first row, fixed for the whole kernel ----
  const int cp_chunk = tid % kChunks, cp_row = tid / kChunks;
  const bool cp_col_ok = cp_chunk * 16 < row_bytes;  // chunks past head_dim stay zero
  const int cp_dst = swz<kRowBytes>(cp_row, cp_chunk);
  const int64_t k_step = int64_t(kRowsPerPass) * p.k_row_stride * int64_t(sizeof(T));  // dense
  const int64_t v_step = int64_t(kRowsPerPass) * p.v_row_stride * int64_t(sizeof(T));
  // Paged: (K, V) byte offsets of the rows of tile n into sOff[st] (threads < kBlockN, one row
  // each; rows past the sequence repeat its last key and are never copied).
  auto resolve_rows = [&](int n, int st) {
    if (tid < kBlockN) {
      int j = n * kBlockN + tid;
      j = j < s.seqlen_k ? j : s.seqlen_k - 1;
      const KvOffsets o = paged_kv_offsets(p, s.table, a.page, j);
      sOff[(st * kBlockN + tid) * 2] = o.k * int64_t(sizeof(T));
      sOff[(st * kBlockN + tid) * 2 + 1] = o.v * int64_t(sizeof(T));
    }
  };
  // Tile n of K (kv = 0) or V (kv = 1) into buffer st.
  auto load_kv = [&](int n, int st, int kv) {
    const int j0 = n * kBlockN;
    const int valid = s.seqlen_k - j0 - cp_row;  // rows of this thread's column that exist
    char* dst = (kv ? sV : sK) + st * Cfg::kSmemKV + cp_dst;
    const char* src;
    int64_t step;
    if (kPaged) {
      src = (kv ? vbase : kbase) + cp_chunk * 16;
      step = 0;
    } else {
      const int64_t row = int64_t(j0 + cp_row);
      src = kv ? vbase + (s.v_base + row * p.v_row_stride) * int64_t(sizeof(T)) + cp_chunk * 16
               : kbase + (s.k_base + row * p.k_row_stride) * int64_t(sizeof(T)) + cp_chunk * 16;
      step = kv ? v_step : k_step;
    }
LLMK_ATTN_UNROLL
    for (int i = 0; i < kPasses; ++i) {
      const bool ok = cp_col_ok && i * kRowsPerPass < valid;
      const char* g_src = kPaged ? src + sOff[(st * kBlockN + cp_row + i * kRowsPerPass) * 2 + kv]
                                 : src + i * step;
      // Passes of a multiple of 8 rows keep the swizzle phase: a constant step.
      const int d_off = kRowsPerPass % 8 == 0 ? i * kRowsPerPass * kRowBytes
                                              : swz<kRowBytes>(cp_row + i * kRowsPerPass, cp_chunk) - cp_dst;
      llmk::simt::cp_async_16(dst + d_off, ok ? g_src : static_cast<const char*>(p.k), ok ? 16 : 0);
    }
  };

  // ---- stage Q (rows past the sequence and columns past head_dim are zero-filled) ----
  if (kPaged && n_hi > n_lo) {  // the offsets of the first two tiles, before anything is copied
    resolve_rows(n_hi - 1, 0);
    if (n_hi - 2 >= n_lo) resolve_rows(n_hi - 2, 1);
    __syncthreads();
  }
  load_tile_async<kRowBytes>(
      sQ, kBlockM, rows_total - row0, row_bytes, p.q,
      [&](int r) -> const void* {
        const int R = row0 + r, i = R / a.pack, h = head0 + R % a.pack;
        return q + (s.q_row0 + i) * p.q_row_stride + int64_t(h) * p.q_head_stride;
      },
      tid, kThreads);
  if (n_hi > n_lo) load_kv(n_hi - 1, 0, 0);
  llmk::simt::cp_async_commit();  // group: Q + first K
  if (n_hi > n_lo) load_kv(n_hi - 1, 0, 1);
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
  // Exponent FMA: exp2(x * x_mul - m) with x the raw score (kFold) or the log2-domain score.
  const float x_mul = kFold ? xf.scale_log2 : 1.f;

  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];  // running max (log2 domain) and sum per row
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

  // One key tile: n is the tile, st its buffer; kMask: some row of the tile cannot see some key.
  auto step = [&](int n, int st, auto mask_tag) {
    constexpr bool kMask = decltype(mask_tag)::value;
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
    if (n > n_lo) load_kv(n - 1, st ^ 1, 0);
    llmk::simt::cp_async_commit();
    // This buffer's offsets (tile n) were read by both copies: resolve tile n - 2 into it.
    if (kPaged && n - 2 >= n_lo) resolve_rows(n - 2, st);

    // ---- S = Q K^T over steps t = (k16 step kk, key pair nt2): the fragments of step t + 1 load
    // while step t multiplies (Q fragments once per kk) ----
    float sacc[kMT][kNT][4];
LLMK_ATTN_UNROLL
    for (int mt = 0; mt < kMT; ++mt)
LLMK_ATTN_UNROLL
      for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
        for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
    const char* sKs = sK + st * Cfg::kSmemKV;
    constexpr int kPairs = kNT / 2, kSSteps = kKS * kPairs;
    uint32_t qa[2][kMT][4], kb[2][4];
    auto load_frags = [&](int t) {
      const int kk = t / kPairs, nt2 = t % kPairs;
      if (nt2 == 0) {
LLMK_ATTN_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          if (Cfg::kQRegs) {
LLMK_ATTN_UNROLL
            for (int e = 0; e < 4; ++e) qa[kk & 1][mt][e] = qf[Cfg::kQRegs ? mt : 0][Cfg::kQRegs ? kk : 0][e];
          } else {
            llmk::simt::ldmatrix_x4(qa[kk & 1][mt], sQ + swz<kRowBytes>(warp_row0 + mt * 16 + a_row, kk * 2 + a_chk));
          }
        }
      }
      llmk::simt::ldmatrix_x4(kb[t & 1], sKs + swz<kRowBytes>(nt2 * 16 + k_row, kk * 2 + k_chk));
    };
    load_frags(0);
LLMK_ATTN_UNROLL
    for (int kk = 0; kk < kKS; ++kk) {
LLMK_ATTN_UNROLL
      for (int nt2 = 0; nt2 < kPairs; ++nt2) {
        const int t = kk * kPairs + nt2;
        if (t + 1 < kSSteps) load_frags(t + 1);
LLMK_ATTN_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          Elem<T>::mma(sacc[mt][2 * nt2], qa[kk & 1][mt], kb[t & 1]);
          Elem<T>::mma(sacc[mt][2 * nt2 + 1], qa[kk & 1][mt], kb[t & 1] + 2);
        }
      }
    }

    // ---- mask, online softmax (scores raw when folded, else in the log2 domain) ----
    const int j_base = n * kBlockN + t4 * 2;
LLMK_ATTN_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
LLMK_ATTN_UNROLL
      for (int hh = 0; hh < 2; ++hh) {
        const int rloc = warp_row0 + mt * 16 + g + hh * 8;
        int qi = 0;
        float slope = 0.f;
        if (kMask || has_alibi) {
          qi = sQi[rloc];
          slope = sSlope[rloc];
        }
        const KeyRange kr = rule.range(qi);
        const float dist0 = float(qi + rule.sk - rule.sq - j_base);  // ALiBi distance to key j_base
        float mx = -INFINITY;
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            float x = sacc[mt][nt][hh * 2 + e];
            const int j = j_base + nt * 8 + e;
            if (!kFold) x = unfolded_score(xf, x, has_alibi, slope, dist0 - float(nt * 8 + e));
            if (kMask && (j < kr.lo || j >= kr.hi)) x = -INFINITY;
            sacc[mt][nt][hh * 2 + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mt][hh], mx * x_mul);
        const float alpha = rescale(m_run[mt][hh], m_new);
        m_run[mt][hh] = m_new;
        const float base = attn_exp_base(m_new);
        float sum = 0.f;
LLMK_ATTN_UNROLL
        for (int nt = 0; nt < kNT; ++nt)
LLMK_ATTN_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float pr = exp2f(fmaf(sacc[mt][nt][hh * 2 + e], x_mul, -base));
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
    if (n > n_lo) load_kv(n - 1, st ^ 1, 1);
    llmk::simt::cp_async_commit();

    // ---- O += P V (P re-packed from the S accumulators into A fragments); the V fragments of
    // the next (key step, column pair) load while the current ones multiply ----
    const char* sVs = sV + st * Cfg::kSmemKV;
    constexpr int kVSteps = (kBlockN / 16) * (kDT / 2);
    uint32_t vb[2][4];
    llmk::simt::ldmatrix_x4_trans(vb[0], sVs + swz<kRowBytes>(a_row, a_chk));
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
        const int t = kk * (kDT / 2) + nt2, nx = t + 1;
        if (nx < kVSteps)
          llmk::simt::ldmatrix_x4_trans(
              vb[nx & 1], sVs + swz<kRowBytes>((nx / (kDT / 2)) * 16 + a_row, (nx % (kDT / 2)) * 2 + a_chk));
LLMK_ATTN_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          Elem<T>::mma(o[mt][2 * nt2], pa[mt], vb[t & 1]);
          Elem<T>::mma(o[mt][2 * nt2 + 1], pa[mt], vb[t & 1] + 2);
        }
      }
    }
  };

  // A run of masked tiles, then a run of unmasked ones (the steady state); a second round only
  // for a sliding window's left edge.
  auto masked = [&](int n) { return !(n * kBlockN >= safe_lo && (n + 1) * kBlockN <= safe_hi); };
  int n = n_hi - 1, stage = 0;
LLMK_ATTN_NO_UNROLL
  while (n >= n_lo) {
LLMK_ATTN_NO_UNROLL
    for (; n >= n_lo && masked(n); --n, stage ^= 1) step(n, stage, std::true_type());
LLMK_ATTN_NO_UNROLL
    for (; n >= n_lo && !masked(n); --n, stage ^= 1) step(n, stage, std::false_type());
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
