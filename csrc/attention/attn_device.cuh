// Device-side building blocks shared by the CUDA attention kernels (flash_prefill*.cu,
// flash_decode.cu, flash_fp32.cu, flash_combine.cu): per-sequence geometry, K/V row addressing
// (dense or paged), swizzled shared-memory tiles filled by cp.async, and the log2-domain forms
// of the shared math in attention_math.h (masks, softcap, ALiBi, LSE) that the kernels use.
//
// Written only against the SIMT portability layer (common/simt.h), so the same code runs on the
// GPU and under emulation.
#pragma once
#include <cstdint>
#include <cstring>

#include "attention/attention_math.h"
#include "attention/flash_attn.h"
#include "attention/paged_kv.h"
#include "common/macros.h"
#include "common/simt.h"

// `LLMK_ATTN_UNROLL` / `LLMK_ATTN_NO_UNROLL` for nvcc; nothing for the host compiler of the SIMT
// build (which would warn).
#if defined(__CUDACC__)
#define LLMK_ATTN_UNROLL _Pragma("unroll")
#define LLMK_ATTN_NO_UNROLL _Pragma("unroll 1")
#else
#define LLMK_ATTN_UNROLL
#define LLMK_ATTN_NO_UNROLL
#endif

namespace llmk {
namespace gpu {
namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename To, typename From>
LLMK_DEVICE To bit_as(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit_as: sizes differ");
  To t;
  memcpy(&t, &f, sizeof(To));
  return t;
}

// ---- element types ---------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<__half> {
  LLMK_DEVICE static uint32_t pack(float lo, float hi) {
    return bit_as<uint32_t>(__floats2half2_rn(lo, hi));
  }
  LLMK_DEVICE static void mma(float* d, const uint32_t* a, const uint32_t* b) {
    llmk::simt::mma_m16n8k16_f16(d, a, b, d);
  }
  LLMK_DEVICE static __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Elem<__nv_bfloat16> {
  LLMK_DEVICE static uint32_t pack(float lo, float hi) {
    return bit_as<uint32_t>(__floats2bfloat162_rn(lo, hi));
  }
  LLMK_DEVICE static void mma(float* d, const uint32_t* a, const uint32_t* b) {
    llmk::simt::mma_m16n8k16_bf16(d, a, b, d);
  }
  LLMK_DEVICE static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct Elem<float> {
  LLMK_DEVICE static float from_float(float x) { return x; }
};

// ---- launch arguments ------------------------------------------------------------------------

// n / d for 0 <= n < 2^31 by one 64-bit multiply (Granlund-Montgomery; d >= 1 fixed per launch):
// the page index of a key in any page size, without an integer division per row.
struct FastDiv {
  uint64_t mul = 1;
  int shift = 0;
  uint32_t d = 1;
  static FastDiv make(uint32_t d) {  // host side
    FastDiv f;
    f.d = d;
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    f.shift = 32 + l;
    f.mul = ((uint64_t(1) << f.shift) / d) + 1;
    return f;
  }
  LLMK_DEVICE int div(int n) const { return int((uint64_t(uint32_t(n)) * mul) >> shift); }
};

// What every attention kernel receives: the front's AttnParams plus launch-derived values.
struct KernelArgs {
  AttnParams p;
  int group = 1;       // Hq / Hkv
  int pack = 1;        // query heads folded into the row dimension (1, or group: GQA packing)
  int num_splits = 1;  // > 1: write partials to the split workspace for the combine kernel
  int m_blocks = 1;    // row tiles per (sequence, head pack)
  int batch0 = 0;      // sequence of blockIdx.{y,z} == 0 (grids cover 65,535 sequences at most)
  FastDiv page;        // division by block_size (paged K/V)
};

// ---- per-sequence geometry -------------------------------------------------------------------

struct SeqInfo {
  int seqlen_q = 0, seqlen_k = 0;
  int64_t q_row0 = 0;      // global query row of this sequence's position 0
  int64_t k_base = 0;      // dense K/V: element offset of key 0 (K and V share the row index)
  int64_t v_base = 0;
  const int32_t* table = nullptr;  // paged: this sequence's block-table row
};

LLMK_DEVICE SeqInfo seq_info(const AttnParams& p, int b) {
  SeqInfo s;
  s.q_row0 = attn_q_start(p, b);
  s.seqlen_q = attn_seqlen_q(p, b);
  s.seqlen_k = attn_seqlen_k(p, b);
  if (p.block_table) {
    s.table = p.block_table + int64_t(b) * p.block_table_stride;
  } else if (p.cu_seqlens_k) {
    s.k_base = int64_t(p.cu_seqlens_k[b]) * p.k_row_stride;
    s.v_base = int64_t(p.cu_seqlens_k[b]) * p.v_row_stride;
  } else {
    const int64_t cb = attn_cache_batch(p, b), r0 = attn_k_row0(p, b);
    s.k_base = cb * p.k_batch_stride + r0 * p.k_row_stride;
    s.v_base = cb * p.v_batch_stride + r0 * p.v_row_stride;
  }
  return s;
}

// Element offsets of key j's row (for one kv head, added separately) in K and V: paged, the
// addressing of paged_kv.h with the page division done by FastDiv.
LLMK_DEVICE KvOffsets kv_row(const KernelArgs& a, const SeqInfo& s, int j) {
  const AttnParams& p = a.p;
  if (s.table) return paged_kv_offsets(p, s.table, a.page, j);
  return {s.k_base + int64_t(j) * p.k_row_stride, s.v_base + int64_t(j) * p.v_row_stride};
}

// ---- masks and scores (log2 domain) ------------------------------------------------------------
// Query i of a sequence sees keys attn_key_range(i, sq, sk, window_left, window_right); the
// kernels keep sq, sk and the window here and test whole tiles against the range of the first
// and last query of a tile.

struct MaskRule {
  int sq = 0, sk = 0, left = -1, right = -1;
  LLMK_DEVICE KeyRange range(int i) const { return attn_key_range(i, sq, sk, left, right); }
  LLMK_DEVICE int lo(int i) const { return range(i).lo; }
  LLMK_DEVICE int hi(int i) const {
    const int h = range(i).hi;
    return h < 0 ? 0 : h;
  }
};

LLMK_DEVICE MaskRule mask_rule(const AttnParams& p, const SeqInfo& s) {
  MaskRule m;
  m.sq = s.seqlen_q;
  m.sk = s.seqlen_k;
  m.left = p.window_left;
  m.right = p.window_right;  // the front sets 0 for causal
  return m;
}

// Scores in the log2 domain of the online softmax (exp(x) = exp2(x * log2e)):
//   x = attn_softcap(scale * q.k, softcap) * log2e  (+ attn_alibi with a log2e-scaled slope),
// with the softcap's division hoisted: cap * tanh(scale * qk / cap) = post * tanh(pre * qk).
struct ScoreXform {
  float scale_log2 = kLog2e, cap = 0.f, pre = 0.f, post = 0.f;
  LLMK_DEVICE float apply(float qk) const {
    return cap > 0.f ? tanhf(qk * pre) * post : qk * scale_log2;
  }
};

// The log2-domain score of a kernel that does not fold the scale (softcap or ALiBi present):
// softcap of scale * q.k, plus the ALiBi bias at query-key distance `dist` (attn_alibi_dist) when
// `alibi` (slope_log2 from alibi_slope_log2). Shared by the mma.sync and the sm_90a prefill.
LLMK_DEVICE float unfolded_score(const ScoreXform& xf, float qk, bool alibi, float slope_log2, float dist) {
  const float x = xf.apply(qk);
  return alibi ? x + attn_alibi_dist(slope_log2, dist) : x;
}

LLMK_DEVICE ScoreXform score_xform(const AttnParams& p) {
  ScoreXform x;
  x.scale_log2 = p.softmax_scale * kLog2e;
  x.cap = p.softcap;
  if (p.softcap > 0.f) {
    x.pre = p.softmax_scale / p.softcap;
    x.post = p.softcap * kLog2e;
  }
  return x;
}

// Without softcap and ALiBi (and with scale > 0) a kernel may keep the raw q.k scores, take their
// maximum (a positive scale does not change which is largest) and apply scale * log2e in the
// FMA of the exponent: exp2(qk * scale_log2 - m).
LLMK_HD bool scores_fold(const AttnParams& p) {
  return !(p.softcap > 0.f) && p.alibi_slopes == nullptr && p.softmax_scale > 0.f;
}

// Score variants of the tensor-core prefill kernels (a template parameter): raw scores with the
// scale folded into the exponent (scores_fold), softcap alone, or ALiBi (with or without softcap).
// ALiBi gets its own instantiation: its per-row bias terms cost registers (spills at head dim 128)
// that the softcap-only kernels then do without.
enum ScoreMode : int { kScoresFolded = 0, kScoresSoftcap = 1, kScoresAlibi = 2 };

LLMK_HD ScoreMode score_mode(const AttnParams& p) {
  return scores_fold(p) ? kScoresFolded : p.alibi_slopes ? kScoresAlibi : kScoresSoftcap;
}

// ALiBi slope of query head h times log2e (0 when off): attn_alibi(slope_log2, ...) is then the
// bias in the log2 domain.
LLMK_DEVICE float alibi_slope_log2(const AttnParams& p, int b, int h) {
  if (!p.alibi_slopes) return 0.f;
  return p.alibi_slopes[int64_t(b) * p.alibi_batch_stride + h] * kLog2e;
}

// exp2(x - m) with the running max m still -inf giving 0, not NaN (attn_exp_base's rule).
LLMK_DEVICE float exp2_shifted(float x, float m) { return exp2f(x - attn_exp_base(m)); }

// Rescale factor of the accumulators when the running max moves from m_old to m_new.
LLMK_DEVICE float rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
}

// Natural-log LSE from the log2-domain running max and the row sum. A row that saw no key gets
// `empty`: +inf in the final output (flash-attn's convention, attn_lse), -inf in a split partial
// (weight 0 in attn_combine_weights).
LLMK_DEVICE float lse_of(float m_log2, float l, float empty) {
  return l > 0.f ? (m_log2 + __log2f(l)) * kLn2 : empty;
}

// ---- swizzled tiles in shared memory ---------------------------------------------------------
// A tile row of kRowBytes is made of 16-byte chunks; chunk c of row r lives at chunk
// c ^ (r & 7), so that 8 consecutive rows read at the same logical chunk (ldmatrix, or one
// 16-byte load per lane) hit 8 different bank groups. Needs kRowBytes >= 128.

template <int kRowBytes>
LLMK_DEVICE int swz(int row, int chunk) {
  static_assert(kRowBytes % 128 == 0, "swizzled rows must be multiples of 128 bytes");
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// Copy `rows` rows of `row_bytes` valid bytes (a multiple of 16) into a swizzled tile with
// cp.async; rows >= valid_rows and the bytes past row_bytes are zero-filled (no global read).
// src(r) gives the source row's address. Threads tid = 0..nthreads-1 share the work.
template <int kRowBytes, typename SrcFn>
LLMK_DEVICE void load_tile_async(char* tile, int rows, int valid_rows, int row_bytes,
                                 const void* any_valid_ptr, SrcFn src, int tid, int nthreads) {
  constexpr int kChunks = kRowBytes / 16;
  for (int idx = tid; idx < rows * kChunks; idx += nthreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = r < valid_rows && c * 16 < row_bytes;
    const char* g = ok ? static_cast<const char*>(src(r)) + c * 16
                       : static_cast<const char*>(any_valid_ptr);
    llmk::simt::cp_async_16(tile + swz<kRowBytes>(r, c), g, ok ? 16 : 0);
  }
}

// ---- split-KV partial results ----------------------------------------------------------------
// Workspace layout (caller-allocated, float32): split_out [num_splits, rows, Hq, D],
// split_lse [num_splits, rows, Hq], rows = total query rows. A partial holds the normalised
// output of its key range and that range's LSE (-inf when it saw no key).

LLMK_DEVICE float* split_out_row(const AttnParams& p, int64_t total_rows, int split, int64_t row,
                                 int head) {
  return p.split_out + ((int64_t(split) * total_rows + row) * p.num_heads + head) * p.head_dim;
}

LLMK_DEVICE float* split_lse_at(const AttnParams& p, int64_t total_rows, int split, int64_t row,
                                int head) {
  return p.split_lse + (int64_t(split) * total_rows + row) * p.num_heads + head;
}

// LSE output address of (sequence b, head, query i): attn_lse_offset.
LLMK_DEVICE float* lse_at(const AttnParams& p, int b, int head, int i) {
  return p.lse + attn_lse_offset(p, b, head, i);
}

// Total query rows (for the split workspace): kvcache batch * s; varlen needs cu_seqlens_q[b].
LLMK_DEVICE int64_t total_q_rows(const AttnParams& p) {
  return p.cu_seqlens_q ? int64_t(p.cu_seqlens_q[p.batch]) : int64_t(p.batch) * p.seqlen_q;
}

// The part of the tile range [lo, hi) that split `split` of `num_splits` covers (even division;
// a split may get nothing: lo == hi).
LLMK_DEVICE void split_range(int num_splits, int split, int& lo, int& hi) {
  if (num_splits <= 1) return;
  const int per = (hi - lo + num_splits - 1) / num_splits;
  const int b = lo + split * per;
  const int e = b + per < hi ? b + per : hi;
  lo = b < e ? b : e;
  hi = e;
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
