// Device-side building blocks shared by the CUDA attention kernels (flash_prefill*.cu,
// flash_decode.cu, flash_fp32.cu, flash_combine.cu): per-sequence geometry, K/V row addressing
// (dense or paged), swizzled shared-memory tiles filled by cp.async, mask ranges, score
// transforms (scale, softcap, ALiBi) and the split-KV partial-result writers.
//
// Written only against the SIMT portability layer (common/simt.h), so the same code runs on the
// GPU and under emulation.
#pragma once
#include <cstdint>
#include <cstring>

#include "attention/flash_attn.h"
#include "common/macros.h"
#include "common/simt.h"

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
  if (p.cu_seqlens_q) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  } else {
    s.q_row0 = int64_t(b) * p.seqlen_q;
    s.seqlen_q = p.seqlen_q;
  }
  s.seqlen_k = p.seqused_k ? p.seqused_k[b] : p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  if (p.block_table) {
    s.table = p.block_table + int64_t(b) * p.block_table_stride;
  } else if (p.cu_seqlens_k) {
    s.k_base = int64_t(p.cu_seqlens_k[b]) * p.k_row_stride;
    s.v_base = int64_t(p.cu_seqlens_k[b]) * p.v_row_stride;
  } else {
    s.k_base = int64_t(b) * p.k_batch_stride;
    s.v_base = int64_t(b) * p.v_batch_stride;
  }
  return s;
}

// Element offsets of key j's row (for one kv head, added separately) in K and V.
struct KvRow {
  int64_t k, v;
};

LLMK_DEVICE KvRow kv_row(const KernelArgs& a, const SeqInfo& s, int j) {
  const AttnParams& p = a.p;
  if (s.table) {
    const int page = a.page.div(j);
    const int64_t blk = s.table[page];
    const int64_t slot = j - page * p.block_size;
    return {blk * p.k_block_stride + slot * p.k_row_stride,
            blk * p.v_block_stride + slot * p.v_row_stride};
  }
  return {s.k_base + int64_t(j) * p.k_row_stride, s.v_base + int64_t(j) * p.v_row_stride};
}

// ---- masks -----------------------------------------------------------------------------------
// Query position i of a sequence sees keys [key_lo(i), key_hi(i)): bottom-right aligned causal /
// sliding window (window_left/right, -1 = unbounded), clipped to [0, seqlen_k).

struct MaskRule {
  int sk = 0, shift = 0;  // shift = seqlen_k - seqlen_q: query i sits at key position i + shift
  int left = -1, right = -1;
  LLMK_DEVICE int lo(int i) const {
    if (left < 0) return 0;
    const int v = i + shift - left;
    return v < 0 ? 0 : v;
  }
  LLMK_DEVICE int hi(int i) const {
    if (right < 0) return sk;
    const int v = i + shift + right + 1;
    return v < 0 ? 0 : (v > sk ? sk : v);
  }
};

LLMK_DEVICE MaskRule mask_rule(const AttnParams& p, const SeqInfo& s) {
  MaskRule m;
  m.sk = s.seqlen_k;
  m.shift = s.seqlen_k - s.seqlen_q;
  m.left = p.window_left;
  m.right = p.causal ? 0 : p.window_right;
  return m;
}

// Score transform into the log2 domain used by the online softmax:
//   x = scale * q.k, softcapped (softcap * tanh(x / softcap)), minus slope * |i + shift - j|,
//   all times log2(e) so that exp(x) = exp2(x * log2e).
struct ScoreXform {
  float mul = 0.f;         // no softcap: scale * log2e; softcap: scale / softcap
  float cap_log2 = 0.f;    // softcap * log2e (0 = no softcap)
  LLMK_DEVICE float apply(float s) const {
    return cap_log2 != 0.f ? cap_log2 * tanhf(s * mul) : s * mul;
  }
};

LLMK_DEVICE ScoreXform score_xform(const AttnParams& p) {
  ScoreXform x;
  if (p.softcap > 0.f) {
    x.mul = p.softmax_scale / p.softcap;
    x.cap_log2 = p.softcap * kLog2e;
  } else {
    x.mul = p.softmax_scale * kLog2e;
  }
  return x;
}

// ALiBi slope of query head h (times log2e), 0 when off.
LLMK_DEVICE float alibi_slope_log2(const AttnParams& p, int b, int h) {
  if (!p.alibi_slopes) return 0.f;
  return p.alibi_slopes[int64_t(b) * p.alibi_batch_stride + h] * kLog2e;
}

// exp2 of (x - m) that is 0 (not NaN) when the running max is still -inf.
LLMK_DEVICE float exp2_shifted(float x, float m) {
  return exp2f(x - (m == -INFINITY ? 0.f : m));
}

// Rescale factor of the accumulators when the running max moves from m_old to m_new.
LLMK_DEVICE float rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
}

// Natural-log LSE from the log2-domain running max and the row sum (-inf for an empty row).
LLMK_DEVICE float lse_of(float m_log2, float l) {
  return l > 0.f ? (m_log2 + __log2f(l)) * kLn2 : -INFINITY;
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

// LSE output address: varlen [Hq, total_q] (row = global row), kvcache [b, Hq, s] (row = i).
LLMK_DEVICE float* lse_at(const AttnParams& p, int b, int head, int64_t q_row0, int i) {
  const int64_t r = p.cu_seqlens_q ? q_row0 + i : i;
  return p.lse + int64_t(b) * p.lse_batch_stride + int64_t(head) * p.lse_head_stride +
         r * p.lse_row_stride;
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
