// Attention math shared by the CPU and CUDA kernels (LLMK_HD = host + device): sequence
// geometry from AttnParams, the mask rules (causal / sliding window, bottom-right aligned),
// softcap, ALiBi, the online-softmax state and the split-KV log-sum-exp combine.
//
// Conventions (flash-attn 2): for a sequence with sq queries and sk keys, query i sits at key
// position i + sk - sq. Scores are s = softcap(scale * q.k) + alibi, softcap(x) =
// c * tanh(x / c), alibi = -slope * |i + sk - sq - j|. Query i sees key j when
//   j >= i + sk - sq - window_left   (window_left  >= 0)
//   j <= i + sk - sq + window_right  (window_right >= 0; causal = window_right 0).
#pragma once
#include <math.h>
#include <stdint.h>

#include "attention/flash_attn.h"
#include "attention/paged_kv.h"
#include "common/macros.h"

LLMK_NS_BEGIN

// ---- sequence geometry ----------------------------------------------------------------------

LLMK_HD int attn_q_start(const AttnParams& p, int b) {
  return p.cu_seqlens_q ? p.cu_seqlens_q[b] : b * p.seqlen_q;
}
LLMK_HD int attn_seqlen_q(const AttnParams& p, int b) {
  return p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.seqlen_q;
}
// kvcache extras (dense caches): the cache batch sequence b reads and its first key row.
LLMK_HD int64_t attn_cache_batch(const AttnParams& p, int b) {
  return p.cache_batch_idx ? p.cache_batch_idx[b] : b;
}
LLMK_HD int attn_k_row0(const AttnParams& p, int b) { return p.leftpad_k ? p.leftpad_k[b] : 0; }

LLMK_HD int attn_seqlen_k(const AttnParams& p, int b) {
  return p.seqused_k ? p.seqused_k[b] + p.seqused_k_add - attn_k_row0(p, b)
                     : p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
}

// Element offset of key/value row j of sequence b, kv head h (dense varlen, dense kvcache or
// paged), relative to p.k / p.v.
LLMK_HD int64_t attn_kv_offset(const AttnParams& p, bool is_v, int b, int j, int h) {
  const int64_t rs = is_v ? p.v_row_stride : p.k_row_stride;
  const int64_t hs = is_v ? p.v_head_stride : p.k_head_stride;
  if (p.block_table) {
    const PagedRow<int> r =
        paged_row(p.block_table + b * p.block_table_stride, PageDiv{p.block_size}, p.block_size, j);
    return r.block * (is_v ? p.v_block_stride : p.k_block_stride) + r.slot * rs + h * hs;
  }
  if (p.cu_seqlens_k) return (int64_t(p.cu_seqlens_k[b]) + j) * rs + h * hs;
  return attn_cache_batch(p, b) * (is_v ? p.v_batch_stride : p.k_batch_stride) +
         (int64_t(attn_k_row0(p, b)) + j) * rs + h * hs;
}

LLMK_HD int64_t attn_lse_offset(const AttnParams& p, int b, int h, int i) {
  const int64_t row = (p.cu_seqlens_q ? p.cu_seqlens_q[b] : 0) + i;
  return b * p.lse_batch_stride + h * p.lse_head_stride + row * p.lse_row_stride;
}

// ---- masks ------------------------------------------------------------------------------------

// Keys [lo, hi) visible to query i (possibly empty: lo >= hi).
struct KeyRange {
  int lo, hi;
};

LLMK_HD KeyRange attn_key_range(int i, int sq, int sk, int window_left, int window_right) {
  const int pos = i + sk - sq;  // the query's position among the keys
  KeyRange r{0, sk};
  if (window_left >= 0 && pos - window_left > r.lo) r.lo = pos - window_left;
  if (window_right >= 0 && pos + window_right + 1 < r.hi) r.hi = pos + window_right + 1;
  return r;
}

// ---- score transforms -------------------------------------------------------------------------

LLMK_HD float attn_softcap(float s, float cap) { return cap > 0.f ? cap * tanhf(s / cap) : s; }

// The bias at distance d = pos - j between the query's key position pos (query i: pos = i + sk -
// sq) and key j, d as a float (exact below 2^24): kernels form it as a per-row, per-tile base
// minus a constant, one FADD and one FFMA per score.
LLMK_HD float attn_alibi_dist(float slope, float d) { return -slope * fabsf(d); }

LLMK_HD float attn_alibi(float slope, int i, int j, int sq, int sk) {
  return attn_alibi_dist(slope, float(i + sk - sq - j));
}

// ---- online softmax ---------------------------------------------------------------------------

// Running max m and sum l of exp(s - m) over the keys seen so far; m = -inf before any key.
struct SoftmaxState {
  float m, l;
};

// The base used for exp(s - base): a row that has seen only masked keys (m = -inf) uses 0 so that
// exp(-inf - 0) = 0 instead of NaN.
LLMK_HD float attn_exp_base(float m) { return m == -INFINITY ? 0.f : m; }

// Folds a tile whose scores have maximum tile_max into the state. Returns alpha, the factor the
// running output must be scaled by; the caller then adds sum_j exp(s_j - new m) to st.l and the
// matching P.V to the output.
LLMK_HD float attn_softmax_rescale(SoftmaxState& st, float tile_max) {
  const float m_new = st.m > tile_max ? st.m : tile_max;
  // Nothing seen yet (m = -inf): the running sum and output are 0 and stay so (alpha 0).
  const float alpha = st.m == -INFINITY ? 0.f : expf(st.m - m_new);
  st.l *= alpha;
  st.m = m_new;
  return alpha;
}

// Merges two partial states (e.g. of two key ranges) into a; returns the weights the partial
// (un-normalised) outputs take: out = wa * out_a + wb * out_b.
LLMK_HD void attn_softmax_merge(SoftmaxState& a, const SoftmaxState& b, float& wa, float& wb) {
  const float m = a.m > b.m ? a.m : b.m;
  const float base = attn_exp_base(m);
  wa = a.m == -INFINITY ? 0.f : expf(a.m - base);
  wb = b.m == -INFINITY ? 0.f : expf(b.m - base);
  a.l = a.l * wa + b.l * wb;
  a.m = m;
}

// Natural log-sum-exp of the row; +inf when it saw no key (flash-attn's convention).
LLMK_HD float attn_lse(const SoftmaxState& st) {
  return st.l > 0.f ? st.m + logf(st.l) : INFINITY;
}

// ---- split-KV combine -------------------------------------------------------------------------

// Partial results of n splits for one (row, head): lse_s (-inf = split saw no key) and outputs
// out_s normalised by their own sums. Writes the merged weights w_s = exp(lse_s - lse) into w
// and returns the merged lse (+inf when no split saw a key; then all weights are 0).
LLMK_HD float attn_combine_weights(const float* lse_s, int64_t stride, int n, float* w) {
  float mx = -INFINITY;
  for (int s = 0; s < n; ++s) mx = lse_s[s * stride] > mx ? lse_s[s * stride] : mx;
  if (mx == -INFINITY) {
    for (int s = 0; s < n; ++s) w[s] = 0.f;
    return INFINITY;
  }
  float sum = 0.f;
  for (int s = 0; s < n; ++s) {
    w[s] = expf(lse_s[s * stride] - mx);
    sum += w[s];
  }
  const float inv = 1.f / sum;
  for (int s = 0; s < n; ++s) w[s] *= inv;
  return mx + logf(sum);
}

LLMK_NS_END
