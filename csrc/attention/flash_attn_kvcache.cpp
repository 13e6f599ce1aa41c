// The kvcache front ends of the attention ops (flash_attn_with_kvcache: decode / multi-token
// append over a dense or paged cache, with flash-attn's extras: rotary, cache_batch_idx,
// cache_leftpad): every argument checked, the append and the attention dispatched. The checks and
// setters shared with the varlen front are in flash_attn_front.h.
#include "attention/flash_attn.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "attention/flash_attn_front.h"
#include "common/checks.h"
#include "common/overlap.h"
#include "kvcache/kv_quant_front.h"

namespace llmk {
using namespace attn_front;

namespace {

// flash_attn_with_kvcache's flash-attn extras, checked: rotary tables, cache_batch_idx and
// cache_leftpad (dense caches only, as flash-attn), the rotated-query buffer.
struct KvcacheExtras {
  const int32_t* batch_idx = nullptr;
  const int32_t* leftpad = nullptr;
  bool leftpad_on_host = false;  // its entries can be checked here
  void* q_rot = nullptr;
  int rotary_dim = 0;
  int64_t seqlen_ro = 0, cache_batches = 0, capacity = 0;
};

KvcacheExtras check_kvcache_extras(const TensorView& q, const TensorView& k_cache, bool has_new,
                                   bool paged, int64_t batch, int64_t capacity,
                                   const std::optional<TensorView>& cos,
                                   const std::optional<TensorView>& sin,
                                   const std::optional<TensorView>& batch_idx,
                                   const std::optional<TensorView>& leftpad,
                                   const std::optional<TensorView>& q_rot) {
  KvcacheExtras ex;
  ex.capacity = capacity;
  ex.cache_batches = k_cache.size(0);
  LLMK_CHECK(cos.has_value() == sin.has_value(), ValueError, cos ? "rotary_sin" : "rotary_cos",
             ": rotary_cos and rotary_sin must be given together");
  if (cos) {
    LLMK_CHECK(has_new, ValueError, "rotary_cos: rotary embedding needs the new k/v to append "
               "(flash-attn rotates the appended keys and q at the cache positions)");
    for (const auto* t : {&*cos, &*sin}) {
      const char* name = t == &*cos ? "rotary_cos" : "rotary_sin";
      check_ndim(*t, name, 2, "[seqlen_ro, rotary_dim / 2]");
      check_same_dtype(q, "q", *t, name);
      check_same_device(q, "q", *t, name);
      check_last_dim_contiguous(*t, name);
    }
    LLMK_CHECK(sin->size(0) == cos->size(0) && sin->size(1) == cos->size(1), ValueError,
               "rotary_sin: expected shape ", shape_str(*cos), " (as rotary_cos), got ", shape_str(*sin));
    const int64_t rd = cos->size(1) * 2;
    LLMK_CHECK(rd >= 2 && rd <= q.size(3), ValueError, "rotary_cos: rotary_dim (2 x dim 1 = ", rd,
               ") must be in [2, head_dim = ", q.size(3), "]");
    LLMK_CHECK(cos->size(0) >= capacity, ValueError, "rotary_cos: has ", cos->size(0),
               " positions, fewer than the cache's ", capacity, " rows per sequence");
    LLMK_CHECK(q_rot.has_value(), ValueError, "q_rot: a buffer shaped as q is needed with rotary");
    check_contiguous(*q_rot, "q_rot");
    check_same_dtype(q, "q", *q_rot, "q_rot");
    check_same_device(q, "q", *q_rot, "q_rot");
    LLMK_CHECK(q_rot->numel() == q.numel(), ValueError, "q_rot: expected ", q.numel(),
               " elements (shaped as q), got ", q_rot->numel());
    ex.rotary_dim = static_cast<int>(rd);
    ex.seqlen_ro = cos->size(0);
    ex.q_rot = q_rot->data;
  }
  if (batch_idx) {
    LLMK_CHECK(!paged, NotImplementedError,
               "cache_batch_idx: not supported with a paged cache (block_table), as flash-attn");
    check_int32_index(*batch_idx, "cache_batch_idx", 1, "[batch]");
    check_same_device(q, "q", *batch_idx, "cache_batch_idx");
    check_dim(*batch_idx, "cache_batch_idx", 0, batch, "batch, from q");
    if (host_readable(*batch_idx)) {
      const int32_t* bi = batch_idx->ptr<const int32_t>();
      for (int64_t b = 0; b < batch; ++b)
        LLMK_CHECK(bi[b] >= 0 && bi[b] < ex.cache_batches, IndexOutOfRangeError, "cache_batch_idx: entry ",
                   b, " is ", bi[b], ", out of range [0, ", ex.cache_batches, ") of cache batches");
    }
    ex.batch_idx = batch_idx->ptr<const int32_t>();
  }
  if (leftpad) {
    LLMK_CHECK(!paged, NotImplementedError,
               "cache_leftpad: not supported with a paged cache (block_table), as flash-attn");
    check_int32_index(*leftpad, "cache_leftpad", 1, "[batch]");
    check_same_device(q, "q", *leftpad, "cache_leftpad");
    check_dim(*leftpad, "cache_leftpad", 0, batch, "batch, from q");
    ex.leftpad = leftpad->ptr<const int32_t>();
    ex.leftpad_on_host = host_readable(*leftpad);
  }
  return ex;
}

// Per-sequence checks once cache_seqlens[b] is readable on the host.
void check_kvcache_extras_row(const KvcacheExtras& ex, int64_t b, int64_t len, int64_t s_new,
                              int64_t sq, bool q_per_row) {
  if (ex.leftpad && ex.leftpad_on_host) {
    const int64_t lp = ex.leftpad[b];
    LLMK_CHECK(lp >= 0 && lp <= len, ValueError, "cache_leftpad: entry ", b, " is ", lp,
               ", must be in [0, cache_seqlens[", b, "] = ", len, "]");
  }
  if (ex.rotary_dim > 0) {
    const int64_t last = len + std::max(s_new, q_per_row ? sq : int64_t(1)) - 1;
    LLMK_CHECK(last < ex.seqlen_ro, ValueError, "rotary_cos: sequence ", b, " needs position ",
               last, " but the tables have ", ex.seqlen_ro, " rows");
  }
}

}  // namespace

void flash_attn_kvcache_fwd(TensorView q, TensorView k_cache, TensorView v_cache,
                            std::optional<TensorView> k, std::optional<TensorView> v,
                            TensorView cache_seqlens, std::optional<TensorView> block_table,
                            double softmax_scale, bool causal, int64_t window_left,
                            int64_t window_right, double softcap,
                            std::optional<TensorView> alibi_slopes, int64_t num_splits,
                            TensorView out, std::optional<TensorView> softmax_lse,
                            std::optional<TensorView> split_workspace, int64_t stream) {
  flash_attn_kvcache_fwd_ext(q, k_cache, v_cache, k, v, std::nullopt, std::nullopt, cache_seqlens,
                             std::nullopt, std::nullopt, block_table, softmax_scale, causal,
                             window_left, window_right, softcap, false, alibi_slopes, num_splits,
                             out, softmax_lse, split_workspace, std::nullopt, "auto", std::nullopt,
                             std::nullopt, stream);
}

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
                                std::optional<TensorView> q_rot, const std::string& kv_cache_dtype,
                                std::optional<TensorView> k_scale,
                                std::optional<TensorView> v_scale, int64_t stream) {
  const bool paged = block_table.has_value();
  const KvQuant quant = parse_kv_cache_dtype(kv_cache_dtype);
  check_ndim(q, "q", 4, "[batch, seqlen_q, num_heads, head_dim]");
  check_float(q, "q");
  check_last_dim_contiguous(q, "q");
  check_ndim(k_cache, "k_cache", 4,
             paged ? "[num_blocks, block_size, num_kv_heads, head_dim] (paged, block_table given)"
                   : "[batch, seqlen_cache, num_kv_heads, head_dim]");
  check_kv_pair(k_cache, "k_cache", v_cache, "v_cache", q, quant != KvQuant::None);
  const int64_t batch = q.size(0), sq = q.size(1), hq = q.size(2), D = q.size(3);
  const int64_t hkv = k_cache.size(2);
  check_head_dim(D, "q");
  check_dim(k_cache, "k_cache", 3, D, "head_dim, from q");
  check_heads(hq, hkv, "k_cache");
  LLMK_CHECK(batch <= 1 || sq <= 1 || q.stride(0) == sq * q.stride(1), ValueError,
             "q: dims 0 and 1 (batch, seqlen_q) must be mergeable into one row dim (stride(0) == "
             "seqlen_q * stride(1)), got strides (", q.stride(0), ", ", q.stride(1), ")");
  check_out(out, q);
  LLMK_CHECK(batch <= 1 || sq <= 1 || out.stride(0) == sq * out.stride(1), ValueError,
             "out: dims 0 and 1 must be mergeable (stride(0) == seqlen_q * stride(1))");
  check_lse(softmax_lse, q, {batch, hq, sq}, "[batch, num_heads, seqlen_q]");
  LLMK_CHECK(k.has_value() == v.has_value(), ValueError, k ? "v" : "k",
             ": k and v must be given together (the new rows to append)");
  int64_t s_new = 0;
  if (k) {
    check_ndim(*k, "k", 4, "[batch, seqlen_new, num_kv_heads, head_dim]");
    check_kv_pair(*k, "k", *v, "v", q);
    LLMK_CHECK(k->size(0) == batch && k->size(2) == hkv && k->size(3) == D, ValueError,
               "k: expected shape [", batch, ", seqlen_new, ", hkv, ", ", D, "], got ",
               shape_str(*k));
    s_new = k->size(1);
  }
  check_int32_index(cache_seqlens, "cache_seqlens", 1, "[batch]");
  check_same_device(q, "q", cache_seqlens, "cache_seqlens");
  check_dim(cache_seqlens, "cache_seqlens", 0, batch, "batch, from q");
  check_scalars(softmax_scale, softcap, window_left, window_right);
  const std::initializer_list<Arg> read = {arg(q, "q"), arg(k, "k"), arg(v, "v"),
                                           arg(cache_seqlens, "cache_seqlens"),
                                           arg(block_table, "block_table"), arg(alibi_slopes, "alibi_slopes"),
                                           arg(rotary_cos, "rotary_cos"), arg(rotary_sin, "rotary_sin"),
                                           arg(cache_batch_idx, "cache_batch_idx"),
                                           arg(cache_leftpad, "cache_leftpad")};
  check_written(arg(out, "out"), read);
  check_written(arg(out, "out"), {arg(k_cache, "k_cache"), arg(v_cache, "v_cache"), arg(q_rot, "q_rot")});
  check_written(arg(q_rot, "q_rot"), read);
  check_written(arg(q_rot, "q_rot"), {arg(k_cache, "k_cache"), arg(v_cache, "v_cache")});
  if (k) {  // the new rows are written into the caches
    check_written(arg(v_cache, "v_cache"), {arg(k_cache, "k_cache")});
    check_written(arg(k_cache, "k_cache"), read);
    check_written(arg(v_cache, "v_cache"), read);
  }
  LLMK_CHECK(num_splits >= 0 && num_splits <= 128, ValueError,
             "num_splits: must be in [0, 128] (0 = auto), got ", num_splits);

  AttnParams p = front_params(q, k_cache, v_cache, batch, hq, hkv, D, softmax_scale, softcap, alibi_slopes);
  set_kv_quant(p, quant, kv_cache_dtype, k_cache, "k_cache", v_cache, "v_cache", k_scale, v_scale, hkv);
  int64_t capacity;
  if (paged) {
    capacity = set_paged(p, k_cache, v_cache, *block_table, batch, q, "k_cache", "v_cache");
  } else {
    if (!cache_batch_idx) check_dim(k_cache, "k_cache", 0, batch, "batch, from q");
    capacity = k_cache.size(1);
    p.k_batch_stride = k_cache.stride(0), p.k_row_stride = k_cache.stride(1);
    p.k_head_stride = k_cache.stride(2);
    p.v_batch_stride = v_cache.stride(0), p.v_row_stride = v_cache.stride(1);
    p.v_head_stride = v_cache.stride(2);
    p.k_rows = capacity, p.k_batches = k_cache.size(0);
  }
  p.q_rows = batch * sq;
  LLMK_CHECK(capacity + 0 <= INT32_MAX, ValueError, "k_cache: too many rows per sequence");
  // flash-attn rotates q at per-row positions when the attention is causal or local (a window
  // shorter than the cache); otherwise all of q sits at cache_seqlens[b].
  const bool q_pos_per_row = causal || (window_left >= 0 && window_left < capacity) ||
                             (window_right >= 0 && window_right < capacity);
  const KvcacheExtras ex = check_kvcache_extras(q, k_cache, k.has_value(), paged, batch, capacity,
                                                rotary_cos, rotary_sin, cache_batch_idx,
                                                cache_leftpad, q_rot);
  p.cache_batch_idx = ex.batch_idx;
  p.leftpad_k = ex.leftpad;
  if (host_readable(cache_seqlens)) {
    const int32_t* cs = cache_seqlens.ptr<const int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      LLMK_CHECK(cs[b] >= 0, ValueError, "cache_seqlens: entry ", b, " is ", cs[b], ", must be >= 0");
      check_kvcache_extras_row(ex, b, cs[b], s_new, sq, q_pos_per_row);
      LLMK_CHECK(cs[b] + s_new <= capacity, IndexOutOfRangeError, "cache_seqlens: entry ", b, " is ", cs[b],
                 s_new ? str_cat(" and ", s_new, " new rows are appended, but") : std::string(" but"),
                 paged ? " block_table holds only " : " the cache holds ", capacity,
                 paged ? " rows (max_blocks x block_size)" : " rows");
      if (paged) check_blocks_used(*block_table, static_cast<int>(b), cs[b] + s_new,
                                   k_cache.size(1), k_cache.size(0));
    }
  }
  // Query row b * s + i is addressed with one row stride: stride(1) when [b, s] is packed
  // (checked above), stride(0) when s == 1 (a size-1 dim may carry any stride, e.g. unsqueeze of
  // a fused-qkv slice).
  auto row_stride = [&](const TensorView& t) { return sq == 1 ? t.stride(0) : t.stride(1); };
  p.q = q.data, p.q_row_stride = row_stride(q), p.q_head_stride = q.stride(2);
  if (ex.rotary_dim > 0) p.q = ex.q_rot, p.q_row_stride = hq * D, p.q_head_stride = D;
  p.out = out.data, p.o_row_stride = row_stride(out), p.o_head_stride = out.stride(2);
  p.seqlen_q = static_cast<int>(sq);
  p.seqused_k = cache_seqlens.ptr<const int32_t>();
  p.seqused_k_add = static_cast<int>(s_new);
  p.max_seqlen_q = static_cast<int>(sq);
  p.max_seqlen_k = static_cast<int>(capacity);
  set_window(p, causal, window_left, window_right, capacity);
  p.num_splits = static_cast<int>(num_splits);
  if (softmax_lse) {
    p.lse = softmax_lse->ptr<float>();
    p.lse_batch_stride = softmax_lse->stride(0);
    p.lse_head_stride = softmax_lse->stride(1);
    p.lse_row_stride = softmax_lse->stride(2);
  }
  if (split_workspace && num_splits > 1) {
    const int64_t rows = batch * sq * hq, need = num_splits * rows * (D + 1);
    check_dtype(*split_workspace, "split_workspace", DType::F32);
    check_same_device(q, "q", *split_workspace, "split_workspace");
    check_contiguous(*split_workspace, "split_workspace");
    LLMK_CHECK(split_workspace->numel() >= need, ValueError, "split_workspace: needs ", need,
               " float32 elements for ", num_splits, " splits, got ", split_workspace->numel());
    p.split_out = split_workspace->ptr<float>();
    p.split_lse = p.split_out + num_splits * rows * D;
  }
  if (batch == 0 || hq == 0) return;
#if defined(LLMK_SIMT)
  gpu::flash_attn_check(p);  // CUDA kernels' own limits, before the append writes anything
#elif defined(LLMK_WITH_CUDA)
  if (q.is_cuda()) gpu::flash_attn_check(p);
#endif
  if (s_new > 0 || ex.rotary_dim > 0) {
    AppendKvParams a;
    a.k_new = k->data, a.v_new = v->data;
    a.kn_batch_stride = k->stride(0), a.kn_row_stride = k->stride(1), a.kn_head_stride = k->stride(2);
    a.vn_batch_stride = v->stride(0), a.vn_row_stride = v->stride(1), a.vn_head_stride = v->stride(2);
    a.k_cache = k_cache.data, a.v_cache = v_cache.data;
    static_cast<KvGeom&>(a) = p;  // the cache layout the attention then reads
    a.cache_seqlens = p.seqused_k;
    a.batch = p.batch, a.seqlen_new = static_cast<int>(s_new);
    a.num_kv_heads = p.num_kv_heads, a.head_dim = p.head_dim, a.dtype = q.dtype;
    a.cache_batch_idx = ex.batch_idx;
    if (ex.rotary_dim > 0) {
      a.rotary_cos = rotary_cos->data, a.rotary_sin = rotary_sin->data;
      a.cos_row_stride = rotary_cos->stride(0), a.sin_row_stride = rotary_sin->stride(0);
      a.rotary_dim = ex.rotary_dim, a.seqlen_ro = static_cast<int>(rotary_cos->size(0));
      a.rotary_interleaved = rotary_interleaved;
      a.q = q.data, a.q_row_stride = row_stride(q), a.q_head_stride = q.stride(2);
      a.q_rot = ex.q_rot;
      a.seqlen_q = static_cast<int>(sq), a.num_heads = static_cast<int>(hq);
      a.q_pos_per_row = q_pos_per_row;
    }
    LLMK_RUN(q, append_kv, a, stream);
  }
  if (sq == 0) return;
  LLMK_RUN(q, flash_attn, p, stream);
}

}  // namespace llmk
