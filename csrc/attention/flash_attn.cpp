// Front ends of the attention ops: every argument is checked (names in the messages are the
// Python argument names), then reduced to AttnParams / AppendKvParams and dispatched.
#include "attention/flash_attn.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/checks.h"
#include "common/overlap.h"

namespace llmk {
namespace {

constexpr int kMaxHeadDim = 256;

void check_head_dim(int64_t d, const char* name) {
  LLMK_CHECK(d % 8 == 0 && d >= 8 && d <= kMaxHeadDim, ValueError, name,
             ": head_dim must be a multiple of 8 in [8, ", kMaxHeadDim, "], got ", d);
}

void check_int32_index(const TensorView& t, const char* name, int ndim, const char* layout) {
  check_ndim(t, name, ndim, layout);
  check_dtype(t, name, DType::I32);
  LLMK_CHECK(ndim == 1 ? t.is_contiguous() : t.stride(-1) == 1 || t.size(-1) <= 1, ValueError,
             name, ndim == 1 ? ": must be contiguous" : ": the last dimension must be contiguous");
}

void check_scalars(double softmax_scale, double softcap, int64_t wl, int64_t wr) {
  LLMK_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, ValueError,
             "softmax_scale: must be a positive finite number, got ", softmax_scale);
  LLMK_CHECK(std::isfinite(softcap) && softcap >= 0, ValueError,
             "softcap: must be >= 0 (0 = off), got ", softcap);
  LLMK_CHECK(wl >= -1 && wr >= -1, ValueError,
             "window_size: entries must be >= 0, or -1 for unbounded, got (", wl, ", ", wr, ")");
  LLMK_CHECK(wl <= INT32_MAX && wr <= INT32_MAX, ValueError, "window_size: entries too large");
}

// ALiBi slopes: float32 [Hq] or [b, Hq]; sets the params' pointer and batch stride.
void set_alibi(AttnParams& p, const std::optional<TensorView>& a, const TensorView& q, int64_t batch) {
  if (!a) return;
  check_dtype(*a, "alibi_slopes", DType::F32);
  check_same_device(q, "q", *a, "alibi_slopes");
  LLMK_CHECK(a->ndim == 1 || a->ndim == 2, ValueError,
             "alibi_slopes: expected shape [num_heads] or [batch, num_heads], got ", shape_str(*a));
  LLMK_CHECK(a->size(-1) == p.num_heads && (a->ndim == 1 || a->size(0) == batch), ValueError,
             "alibi_slopes: expected shape [", p.num_heads, "] or [", batch, ", ", p.num_heads,
             "], got ", shape_str(*a));
  check_last_dim_contiguous(*a, "alibi_slopes");
  p.alibi_slopes = a->ptr<const float>();
  p.alibi_batch_stride = a->ndim == 2 ? a->stride(0) : 0;
}

// The params both fronts fill alike, once their argument checks passed: sizes, dtype, K/V data,
// score options and ALiBi (whose checks run here, before the caller's paging ones). The caller
// adds the K/V layout (set_paged or its dense strides), q/out, lengths, window and lse.
AttnParams front_params(const TensorView& q, const TensorView& k, const TensorView& v, int64_t batch,
                        int64_t hq, int64_t hkv, int64_t D, double softmax_scale, double softcap,
                        const std::optional<TensorView>& alibi_slopes) {
  AttnParams p;
  p.batch = static_cast<int>(batch);
  p.num_heads = static_cast<int>(hq);
  p.num_kv_heads = static_cast<int>(hkv);
  p.head_dim = static_cast<int>(D);
  p.dtype = q.dtype;
  p.k = k.data, p.v = v.data;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  set_alibi(p, alibi_slopes, q, batch);
  return p;
}

void set_window(AttnParams& p, bool causal, int64_t wl, int64_t wr, int64_t max_seqlen_k) {
  // flash-attn: windows at least as long as the keys are unbounded; causal = right window 0.
  if (wl >= max_seqlen_k) wl = -1;
  if (wr >= max_seqlen_k) wr = -1;
  if (causal) wr = 0;
  p.causal = causal;
  p.window_left = static_cast<int>(wl);
  p.window_right = static_cast<int>(wr);
}

void check_out(const TensorView& out, const TensorView& q) {
  LLMK_CHECK(out.ndim == q.ndim, ValueError, "out: expected shape ", shape_str(q), " (as q), got ",
             shape_str(out));
  for (int i = 0; i < q.ndim; ++i)
    LLMK_CHECK(out.size(i) == q.size(i), ValueError, "out: expected shape ", shape_str(q),
               " (as q), got ", shape_str(out));
  check_same_dtype(q, "q", out, "out");
  check_same_device(q, "q", out, "out");
  check_last_dim_contiguous(out, "out");
}

struct Arg {
  const TensorView* t;  // null = not given
  const char* name;
};
inline Arg arg(const TensorView& t, const char* n) { return {&t, n}; }
inline Arg arg(const std::optional<TensorView>& t, const char* n) { return {t ? &*t : nullptr, n}; }

// A written tensor may share no byte with any other argument: the kernels read inputs tile by
// tile while writing, so an alias gives results that depend on the schedule.
void check_written(Arg written, std::initializer_list<Arg> others) {
  if (!written.t) return;
  for (const Arg& o : others)
    if (o.t) check_no_overlap(*o.t, o.name, *written.t, written.name);
}

void check_lse(const std::optional<TensorView>& lse, const TensorView& q,
               std::initializer_list<int64_t> dims, const char* layout) {
  if (!lse) return;
  check_shape(*lse, "softmax_lse", dims, layout);
  check_dtype(*lse, "softmax_lse", DType::F32);
  check_same_device(q, "q", *lse, "softmax_lse");
}

// Paged cache [num_blocks, block_size, Hkv, D] + block_table [b, max_blocks]: checks and sets
// the params' paging fields. Returns the cache capacity per sequence.
int64_t set_paged(AttnParams& p, const TensorView& kc, const TensorView& vc, const TensorView& bt,
                  int64_t batch, const TensorView& q, const char* kname, const char* vname) {
  check_int32_index(bt, "block_table", 2, "[batch, max_blocks_per_seq]");
  check_same_device(q, "q", bt, "block_table");
  LLMK_CHECK(bt.size(0) == batch, ValueError, "block_table: dim 0 (batch) must be ", batch,
             ", got ", bt.size(0), " (shape ", shape_str(bt), ")");
  LLMK_CHECK(kc.size(1) >= 1, ValueError, kname, ": block_size (dim 1) must be >= 1, got ", kc.size(1));
  p.block_table = bt.ptr<const int32_t>();
  p.block_table_stride = bt.stride(0);
  p.block_size = static_cast<int>(kc.size(1));
  p.k_blocks = kc.size(0);
  p.k_block_stride = kc.stride(0), p.k_row_stride = kc.stride(1), p.k_head_stride = kc.stride(2);
  p.v_block_stride = vc.stride(0), p.v_row_stride = vc.stride(1), p.v_head_stride = vc.stride(2);
  (void)vname;
  return bt.size(1) * kc.size(1);
}

// Block ids used by sequence b (ceil(len / block_size) entries) must be valid cache blocks.
void check_blocks_used(const TensorView& bt, int b, int64_t len, int64_t block_size,
                       int64_t num_blocks) {
  const int32_t* row = bt.ptr<const int32_t>() + b * bt.stride(0);
  const int64_t used = (len + block_size - 1) / block_size;
  for (int64_t i = 0; i < used; ++i)
    LLMK_CHECK(row[i] >= 0 && row[i] < num_blocks, IndexOutOfRangeError, "block_table: entry [", b, ", ", i,
               "] is ", row[i], ", out of range [0, ", num_blocks, ") of cache blocks");
}

void check_kv_pair(const TensorView& k, const char* kn, const TensorView& v, const char* vn,
                   const TensorView& q) {
  check_float(k, kn);
  check_same_dtype(q, "q", k, kn);
  check_same_dtype(q, "q", v, vn);
  check_same_device(q, "q", k, kn);
  check_same_device(q, "q", v, vn);
  LLMK_CHECK(v.ndim == k.ndim, ValueError, vn, ": expected shape ", shape_str(k), " (as ", kn,
             "), got ", shape_str(v));
  for (int i = 0; i < k.ndim; ++i)
    LLMK_CHECK(v.size(i) == k.size(i), ValueError, vn, ": expected shape ", shape_str(k), " (as ",
               kn, "), got ", shape_str(v));
  check_last_dim_contiguous(k, kn);
  check_last_dim_contiguous(v, vn);
}

void check_heads(int64_t hq, int64_t hkv, const char* kname) {
  LLMK_CHECK(hkv >= 1, ValueError, kname, ": num_kv_heads must be >= 1, got ", hkv);
  LLMK_CHECK(hq % hkv == 0, ValueError, kname, ": num_kv_heads (", hkv,
             ") must divide the number of query heads (", hq, ")");
}

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

void flash_attn_varlen_fwd(TensorView q, TensorView k, TensorView v, TensorView cu_seqlens_q,
                           TensorView cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                           double softmax_scale, bool causal, int64_t window_left,
                           int64_t window_right, double softcap,
                           std::optional<TensorView> alibi_slopes,
                           std::optional<TensorView> block_table, TensorView out,
                           std::optional<TensorView> softmax_lse, int64_t stream) {
  const bool paged = block_table.has_value();
  check_ndim(q, "q", 3, "[total_q, num_heads, head_dim]");
  check_float(q, "q");
  check_last_dim_contiguous(q, "q");
  if (paged) {
    check_ndim(k, "k", 4, "[num_blocks, block_size, num_kv_heads, head_dim] (paged, block_table given)");
  } else {
    check_ndim(k, "k", 3, "[total_k, num_kv_heads, head_dim]");
  }
  check_kv_pair(k, "k", v, "v", q);
  const int64_t D = q.size(2), hq = q.size(1), hkv = k.size(-2);
  check_head_dim(D, "q");
  check_dim(k, "k", k.ndim - 1, D, "head_dim, from q");
  check_heads(hq, hkv, "k");
  check_int32_index(cu_seqlens_q, "cu_seqlens_q", 1, "[batch + 1]");
  check_int32_index(cu_seqlens_k, "cu_seqlens_k", 1, "[batch + 1]");
  check_same_device(q, "q", cu_seqlens_q, "cu_seqlens_q");
  check_same_device(q, "q", cu_seqlens_k, "cu_seqlens_k");
  LLMK_CHECK(cu_seqlens_q.size(0) >= 1, ValueError, "cu_seqlens_q: must have batch + 1 >= 1 entries");
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  check_dim(cu_seqlens_k, "cu_seqlens_k", 0, batch + 1, "batch + 1, from cu_seqlens_q");
  LLMK_CHECK(max_seqlen_q >= 0 && max_seqlen_q <= INT32_MAX, ValueError,
             "max_seqlen_q: must be >= 0, got ", max_seqlen_q);
  LLMK_CHECK(max_seqlen_k >= 0 && max_seqlen_k <= INT32_MAX, ValueError,
             "max_seqlen_k: must be >= 0, got ", max_seqlen_k);
  check_scalars(softmax_scale, softcap, window_left, window_right);
  check_out(out, q);
  check_lse(softmax_lse, q, {hq, q.size(0)}, "[num_heads, total_q]");
  check_written(arg(out, "out"), {arg(q, "q"), arg(k, "k"), arg(v, "v"), arg(cu_seqlens_q, "cu_seqlens_q"),
                                  arg(cu_seqlens_k, "cu_seqlens_k"), arg(alibi_slopes, "alibi_slopes"),
                                  arg(block_table, "block_table")});

  AttnParams p = front_params(q, k, v, batch, hq, hkv, D, softmax_scale, softcap, alibi_slopes);
  int64_t capacity = 0;
  if (paged) {
    capacity = set_paged(p, k, v, *block_table, batch, q, "k", "v");
  } else {
    p.k_row_stride = k.stride(0), p.k_head_stride = k.stride(1);
    p.v_row_stride = v.stride(0), p.v_head_stride = v.stride(1);
    p.k_rows = k.size(0);
  }
  p.q_rows = q.size(0);
  // Lengths are read here on the CPU (and in the SIMT emulator); on CUDA only under
  // LLMKERN_DEBUG_CHECKS would that be allowed, and the CUDA kernels trust them.
  if (host_readable(cu_seqlens_q) && host_readable(cu_seqlens_k) && batch > 0) {
    const int32_t* cq = cu_seqlens_q.ptr<const int32_t>();
    const int32_t* ck = cu_seqlens_k.ptr<const int32_t>();
    LLMK_CHECK(cq[0] >= 0, ValueError, "cu_seqlens_q: entry 0 must be >= 0, got ", cq[0]);
    LLMK_CHECK(ck[0] >= 0, ValueError, "cu_seqlens_k: entry 0 must be >= 0, got ", ck[0]);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t lq = int64_t(cq[b + 1]) - cq[b], lk = int64_t(ck[b + 1]) - ck[b];
      LLMK_CHECK(lq >= 0, ValueError, "cu_seqlens_q: must be non-decreasing, entry ", b + 1, " (",
                 cq[b + 1], ") < entry ", b, " (", cq[b], ")");
      LLMK_CHECK(lk >= 0, ValueError, "cu_seqlens_k: must be non-decreasing, entry ", b + 1, " (",
                 ck[b + 1], ") < entry ", b, " (", ck[b], ")");
      LLMK_CHECK(lq <= max_seqlen_q, ValueError, "max_seqlen_q: is ", max_seqlen_q,
                 " but sequence ", b, " has ", lq, " queries");
      LLMK_CHECK(lk <= max_seqlen_k, ValueError, "max_seqlen_k: is ", max_seqlen_k,
                 " but sequence ", b, " has ", lk, " keys");
      if (paged) {
        LLMK_CHECK(lk <= capacity, IndexOutOfRangeError, "cu_seqlens_k: sequence ", b, " has ", lk,
                   " keys but block_table holds only ", capacity, " (max_blocks x block_size)");
        check_blocks_used(*block_table, static_cast<int>(b), lk, k.size(1), k.size(0));
      }
    }
    LLMK_CHECK(cq[batch] <= q.size(0), ValueError, "cu_seqlens_q: last entry (", cq[batch],
               ") exceeds total_q = q.size(0) = ", q.size(0));
    if (!paged)
      LLMK_CHECK(ck[batch] <= k.size(0), ValueError, "cu_seqlens_k: last entry (", ck[batch],
                 ") exceeds total_k = k.size(0) = ", k.size(0));
  }
  p.q = q.data, p.q_row_stride = q.stride(0), p.q_head_stride = q.stride(1);
  p.out = out.data, p.o_row_stride = out.stride(0), p.o_head_stride = out.stride(1);
  p.cu_seqlens_q = cu_seqlens_q.ptr<const int32_t>();
  p.cu_seqlens_k = cu_seqlens_k.ptr<const int32_t>();
  p.max_seqlen_q = static_cast<int>(max_seqlen_q);
  p.max_seqlen_k = static_cast<int>(max_seqlen_k);
  set_window(p, causal, window_left, window_right, max_seqlen_k);
  if (softmax_lse) {
    p.lse = softmax_lse->ptr<float>();
    p.lse_head_stride = softmax_lse->stride(0);
    p.lse_row_stride = softmax_lse->stride(1);
  }
  p.num_splits = 0;  // auto
  if (batch == 0 || q.size(0) == 0 || hq == 0) return;
  LLMK_RUN(q, flash_attn, p, stream);
}

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
                             out, softmax_lse, split_workspace, std::nullopt, stream);
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
                                std::optional<TensorView> q_rot, int64_t stream) {
  const bool paged = block_table.has_value();
  check_ndim(q, "q", 4, "[batch, seqlen_q, num_heads, head_dim]");
  check_float(q, "q");
  check_last_dim_contiguous(q, "q");
  check_ndim(k_cache, "k_cache", 4,
             paged ? "[num_blocks, block_size, num_kv_heads, head_dim] (paged, block_table given)"
                   : "[batch, seqlen_cache, num_kv_heads, head_dim]");
  check_kv_pair(k_cache, "k_cache", v_cache, "v_cache", q);
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
