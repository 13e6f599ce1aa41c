// Attention ops (flash-attn 2 signatures): flash_attn_varlen_func (dense or paged K/V) and
// flash_attn_with_kvcache (decode / multi-token append, dense or paged cache).
//
// Both fronts reduce their arguments to one AttnParams; the CPU and CUDA kernels consume only it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "attention/paged_kv.h"
#include "common/dispatch.h"
#include "common/tensor.h"

namespace llmk {

// The K/V cache geometry (strides, block table) is the KvGeom base, shared with AppendKvParams.
struct AttnParams : KvGeom {
  // Query rows. Varlen: q is [total_q, Hq, D] and sequence b owns rows cu_seqlens_q[b] ..
  // cu_seqlens_q[b+1]. kvcache: q is [b, s, Hq, D] viewed as rows b*s + i (cu_seqlens_q null,
  // seqlen_q = s). Strides are in elements.
  const void* q = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  void* out = nullptr;  // same layout as q
  int64_t o_row_stride = 0, o_head_stride = 0;

  // Keys/values, laid out as the KvGeom base says. Dense (block_table null): rows [total_k, Hkv,
  // D]; sequence b owns rows k_start(b) = cu_seqlens_k[b] (varlen) or b * k_batch_stride_rows
  // (kvcache, k_batch_stride). Paged (block_table set): caches [num_blocks, block_size, Hkv, D];
  // logical row j of sequence b lives in block block_table[b * block_table_stride + j /
  // block_size], slot j % block_size (paged_kv.h: paged_row).
  const void* k = nullptr;
  const void* v = nullptr;

  // Lengths: seqlen_q(b) = cu_seqlens_q ? cu_seqlens_q[b+1]-cu_seqlens_q[b] : seqlen_q;
  // seqlen_k(b) = seqused_k ? seqused_k[b] + seqused_k_add : cu_seqlens_k[b+1]-cu_seqlens_k[b].
  // kvcache passes cache_seqlens (the lengths BEFORE this call's append) as seqused_k and the
  // number of appended rows as seqused_k_add, so no device buffer has to be built:
  //   seqlen_k(b) = seqused_k[b] + seqused_k_add   (attention_math.h: attn_seqlen_k).
  // Paged varlen keeps cu_seqlens_k (lengths are its differences) and leaves seqused_k null.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  int seqused_k_add = 0;
  int seqlen_q = 0;
  int max_seqlen_q = 0, max_seqlen_k = 0;

  // flash_attn_with_kvcache on a dense cache only: sequence b reads cache batch
  // cache_batch_idx[b] (null = b) and its keys start at cache row leftpad_k[b] (null = 0), so
  // seqlen_k(b) = seqused_k[b] + seqused_k_add - leftpad_k[b] and key j is cache row
  // leftpad_k[b] + j (attention_math.h: attn_cache_batch, attn_k_row0).
  // Row counts for the sm_90 kernel's TMA descriptors (loads past them read zeros); 0 = not
  // given. q_rows: query rows; k_rows: dense varlen k.size(0), or a dense cache's rows per batch
  // entry (k_cache.size(1)) with k_batches = k_cache.size(0); k_blocks: a paged cache's blocks.
  int64_t q_rows = 0, k_rows = 0, k_batches = 0, k_blocks = 0;
  const int32_t* cache_batch_idx = nullptr;
  const int32_t* leftpad_k = nullptr;

  int batch = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::F32;  // q, k, v and out share it

  float softmax_scale = 1.f;
  float softcap = 0.f;                 // 0 = off; else s = softcap * tanh(s / softcap)
  bool causal = false;                 // bottom-right aligned
  int window_left = -1, window_right = -1;  // -1 = unbounded (causal sets window_right = 0)
  const float* alibi_slopes = nullptr; // [Hq] or [b, Hq] (alibi_batch_stride 0 or Hq)
  int64_t alibi_batch_stride = 0;

  // Log-sum-exp (natural log), float32, or null. Varlen: [Hq, total_q]; kvcache: [b, Hq, s].
  // Entry of (sequence b, head h, query i of that sequence):
  //   lse[b * lse_batch_stride + h * lse_head_stride + (q_start(b) + i) * lse_row_stride]
  // with q_start(b) = cu_seqlens_q[b] for varlen (lse_batch_stride 0) and 0 for kvcache.
  // Rows that see no key get lse = +inf and out = 0 (as flash-attn).
  float* lse = nullptr;
  int64_t lse_head_stride = 0, lse_row_stride = 0, lse_batch_stride = 0;

  // Split-KV (flash-decoding): num_splits > 1 partitions each sequence's keys; partial results
  // (un-normalised out as float32 [num_splits, rows, Hq, D] and lse [num_splits, rows, Hq]) are
  // merged by the combine step. Workspace is allocated by the caller (no allocation in kernels).
  // Each split's out is normalised by its own softmax sum and its lse is that split's
  // log-sum-exp (-inf when the split saw no key); attn_combine_splits() in attention_math.h
  // merges them with weights exp(lse_s - lse). The CPU kernel allocates its own workspace when
  // split_out is null. num_splits <= 0 = the kernel chooses (auto), as flash-attn's 0.
  int num_splits = 1;
  float* split_out = nullptr;
  float* split_lse = nullptr;
};

// flash_attn_with_kvcache's in-place append of k/v [b, s_new, Hkv, D] into the cache at rows
// cache_seqlens[b] .. cache_seqlens[b] + s_new - 1 (dense or paged), run before the attention
// kernel of the same call. Cache addressing is the KvGeom base, copied from the call's
// AttnParams (k/v = the caches; a null block_table is a dense cache [b, seqlen_cache, Hkv, D]).
struct AppendKvParams : KvGeom {
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* cache_seqlens = nullptr;  // [b] write position of the first new row
  const int32_t* cache_batch_idx = nullptr;  // dense: sequence b writes cache batch [b] (null = b)
  int batch = 0, seqlen_new = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::F32;  // new rows, caches, q and cos/sin share it

  // Rotary (flash-attn's rotary_cos / rotary_sin [seqlen_ro, rotary_dim / 2]; rotary_dim 0 =
  // off). New key row i of sequence b is rotated at position cache_seqlens[b] + i as it is
  // written. q [b, s_q, Hq, D] (row b * s_q + i) is rotated into q_rot (contiguous, same shape)
  // at cache_seqlens[b] + i when q_pos_per_row (causal / local), else at cache_seqlens[b] for
  // every row; the attention then reads q_rot. Interleaved pairs (2i, 2i+1), else (i, i + rd/2).
  // A position >= seqlen_ro is left unrotated (the front rejects it where it can read lengths).
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t cos_row_stride = 0, sin_row_stride = 0;
  int rotary_dim = 0, seqlen_ro = 0;
  bool rotary_interleaved = false;
  const void* q = nullptr;
  int64_t q_row_stride = 0, q_head_stride = 0;
  void* q_rot = nullptr;
  int seqlen_q = 0, num_heads = 0;
  bool q_pos_per_row = false;
};

}  // namespace llmk

LLMK_DECLARE_KERNEL(flash_attn, (const AttnParams& p, int64_t stream))
LLMK_DECLARE_KERNEL(append_kv, (const AppendKvParams& p, int64_t stream))

namespace llmk {
namespace gpu {
// What the CUDA kernels need beyond the fronts' checks (16-byte aligned rows, head_dim a
// multiple of 8 up to 256); throws NotImplementedError naming the argument. flash_attn runs it
// itself; the kvcache front also calls it before the append so that nothing is written first.
void flash_attn_check(const AttnParams& p);
}  // namespace gpu
}  // namespace llmk

namespace llmk {

// Front ends (flash_attn.cpp): check every argument, build the params, dispatch. The Python
// wrapper allocates out / lse, fills defaults and converts int64 index tensors to int32.
// window_left/right: -1 = unbounded. lse: float32 [Hq, total_q] (varlen) / [b, Hq, s] (kvcache).
// kv_cache_dtype / k_scale / v_scale (kvcache front and paged varlen): vLLM's quantised caches,
// read as they are (kvcache/kv_quant_front.h); "auto" = caches in q's dtype.
void flash_attn_varlen_fwd(TensorView q, TensorView k, TensorView v, TensorView cu_seqlens_q,
                           TensorView cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                           double softmax_scale, bool causal, int64_t window_left,
                           int64_t window_right, double softcap,
                           std::optional<TensorView> alibi_slopes,
                           std::optional<TensorView> block_table, TensorView out,
                           std::optional<TensorView> softmax_lse,
                           const std::string& kv_cache_dtype, std::optional<TensorView> k_scale,
                           std::optional<TensorView> v_scale, int64_t stream);
// cache_seqlens is required here (the wrapper fills it with the cache length when None).
// split_workspace: float32, at least num_splits * b * s * Hq * (D + 1) elements: the split-KV
// partials of the CUDA kernels (which never allocate). The wrapper passes it, with a concrete
// num_splits > 1, for CUDA tensors; without it the CUDA kernels do not split.
void flash_attn_kvcache_fwd(TensorView q, TensorView k_cache, TensorView v_cache,
                            std::optional<TensorView> k, std::optional<TensorView> v,
                            TensorView cache_seqlens, std::optional<TensorView> block_table,
                            double softmax_scale, bool causal, int64_t window_left,
                            int64_t window_right, double softcap,
                            std::optional<TensorView> alibi_slopes, int64_t num_splits,
                            TensorView out, std::optional<TensorView> softmax_lse,
                            std::optional<TensorView> split_workspace, int64_t stream);
// flash-attn 2's full kvcache front: the above plus rotary_cos / rotary_sin [seqlen_ro,
// rotary_dim / 2] (same dtype as q; needs k/v) with q_rot a contiguous buffer shaped as q (the
// rotated queries), cache_batch_idx [b] and cache_leftpad [b] (int32, dense caches only).
void flash_attn_kvcache_fwd_ext(TensorView q, TensorView k_cache, TensorView v_cache,
                                std::optional<TensorView> k, std::optional<TensorView> v,
                                std::optional<TensorView> rotary_cos,
                                std::optional<TensorView> rotary_sin, TensorView cache_seqlens,
                                std::optional<TensorView> cache_batch_idx,
                                std::optional<TensorView> cache_leftpad,
                                std::optional<TensorView> block_table, double softmax_scale,
                                bool causal, int64_t window_left, int64_t window_right,
                                double softcap, bool rotary_interleaved,
                                std::optional<TensorView> alibi_slopes, int64_t num_splits,
                                TensorView out, std::optional<TensorView> softmax_lse,
                                std::optional<TensorView> split_workspace,
                                std::optional<TensorView> q_rot,
                                const std::string& kv_cache_dtype,
                                std::optional<TensorView> k_scale,
                                std::optional<TensorView> v_scale, int64_t stream);

}  // namespace llmk
