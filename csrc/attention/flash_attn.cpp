// Front ends of the attention ops: every argument is checked (names in the messages are the
// Python argument names), then reduced to AttnParams / AppendKvParams and dispatched.
// This file: the checks and setters both fronts share (flash_attn_front.h) and the varlen front;
// the kvcache fronts are in flash_attn_kvcache.cpp.
#include "attention/flash_attn.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "attention/flash_attn_front.h"
#include "common/checks.h"
#include "common/overlap.h"
#include "kvcache/kv_quant_front.h"

namespace llmk {
namespace {

constexpr int kMaxHeadDim = 256;

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

}  // namespace

namespace attn_front {

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

void check_blocks_used(const TensorView& bt, int b, int64_t len, int64_t block_size,
                       int64_t num_blocks) {
  const int32_t* row = bt.ptr<const int32_t>() + b * bt.stride(0);
  const int64_t used = (len + block_size - 1) / block_size;
  for (int64_t i = 0; i < used; ++i)
    LLMK_CHECK(row[i] >= 0 && row[i] < num_blocks, IndexOutOfRangeError, "block_table: entry [", b, ", ", i,
               "] is ", row[i], ", out of range [0, ", num_blocks, ") of cache blocks");
}

void check_kv_pair(const TensorView& k, const char* kn, const TensorView& v, const char* vn,
                   const TensorView& q, bool quantised) {
  if (!quantised) {
    check_float(k, kn);
    check_same_dtype(q, "q", k, kn);
    check_same_dtype(q, "q", v, vn);
  }
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

}  // namespace attn_front

using namespace attn_front;

void flash_attn_varlen_fwd(TensorView q, TensorView k, TensorView v, TensorView cu_seqlens_q,
                           TensorView cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                           double softmax_scale, bool causal, int64_t window_left,
                           int64_t window_right, double softcap,
                           std::optional<TensorView> alibi_slopes,
                           std::optional<TensorView> block_table, TensorView out,
                           std::optional<TensorView> softmax_lse,
                           const std::string& kv_cache_dtype, std::optional<TensorView> k_scale,
                           std::optional<TensorView> v_scale, int64_t stream) {
  const bool paged = block_table.has_value();
  const KvQuant quant = parse_kv_cache_dtype(kv_cache_dtype);
  LLMK_CHECK(quant == KvQuant::None || paged, ValueError, "kv_cache_dtype: '", kv_cache_dtype,
             "' applies to a paged cache (block_table given); dense k/v are in q's dtype");
  check_ndim(q, "q", 3, "[total_q, num_heads, head_dim]");
  check_float(q, "q");
  check_last_dim_contiguous(q, "q");
  if (paged) {
    check_ndim(k, "k", 4, "[num_blocks, block_size, num_kv_heads, head_dim] (paged, block_table given)");
  } else {
    check_ndim(k, "k", 3, "[total_k, num_kv_heads, head_dim]");
  }
  check_kv_pair(k, "k", v, "v", q, quant != KvQuant::None);
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
  set_kv_quant(p, quant, kv_cache_dtype, k, "k", v, "v", k_scale, v_scale, hkv);
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

}  // namespace llmk
