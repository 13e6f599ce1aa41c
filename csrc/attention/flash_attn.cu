// CUDA entry point of the attention ops: gpu::flash_attn (declared in flash_attn.h) checks what
// the CUDA kernels additionally need (head_dim a multiple of 8 up to 256, 16-byte aligned rows)
// and picks a kernel:
//   fp32                          -> CUDA-core kernel (flash_fp32.cu)
//   fp16/bf16, few rows per kv head (decode, verification, short varlen queries)
//                                 -> flash_decode.cu (tensor cores, warps split the keys)
//   a quantised (fp8 / int8) cache -> flash_quant_kv.cu (CUDA cores, codes dequantised in registers)
//   fp16/bf16 otherwise           -> flash_prefill_hd*.cu (tensor cores, rows split over warps),
//                                    or on sm_90 flash_prefill_sm90.cu (wgmma + TMA) where it applies
// then, when the caller supplied a split-KV workspace, the combine kernel. Nothing here touches
// device memory from the host, synchronises or allocates: the call can be captured in a graph.
#include <mutex>
#include <set>
#include <utility>

#include "attention/flash_launch.h"
#include "attention/flash_prefill_sm90_launch.h"
#include "common/device_memory.h"
#include "common/errors.h"

namespace llmk {
namespace gpu {

namespace attn {

bool first_use_on_device(const void* kernel) {
  int dev = 0;
#if defined(__CUDACC__)
  if (cudaGetDevice(&dev) != cudaSuccess) throw RuntimeError("flash_attn: cudaGetDevice failed");
#endif
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert({kernel, dev}).second;
}

namespace {

// Query rows per kv head up to which the decode-shaped kernel is used for fp16/bf16.
constexpr int kDecodeMaxRows = 2 * kDecodeRows;

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

void check_rows_aligned(const char* name, const void* ptr, size_t es,
                        std::initializer_list<int64_t> strides) {
  bool ok = ptr == nullptr || aligned16(ptr);
  for (int64_t st : strides) ok = ok && (st * int64_t(es)) % 16 == 0;
  LLMK_CHECK(ok, NotImplementedError, name,
             ": the CUDA attention kernels load rows with 16-byte copies and need a 16-byte "
             "aligned data pointer and strides that are multiples of 16 bytes (a contiguous "
             "head_dim that is a multiple of 8); got a misaligned view");
}

template <typename T, int kD>
void dispatch(attn::KernelArgs& a, int64_t stream) {
  const AttnParams& p = a.p;
  const int rows = p.max_seqlen_q * a.group;
  if (p.dtype == DType::F32 || rows <= kDecodeMaxRows) {
    launch_decode<T, kD>(a, stream);
  } else {
    constexpr int kBlockM = prefill_block_m(kD);
    // Fold the query heads of a kv head into the row tile when a head alone would leave it
    // mostly empty: the K/V tiles are then shared by the whole group.
    a.pack = a.group > 1 && p.max_seqlen_q < kBlockM ? a.group : 1;
    if (sm90_prefill_selected(a, kD) && launch_prefill_sm90<T, kD>(a, stream)) return;
    launch_prefill<T, kD>(a, stream);
  }
  if (a.num_splits > 1) launch_combine<T>(a, stream);
}

template <typename T>
void dispatch_dim(attn::KernelArgs& a, int64_t stream) {
  const int D = a.p.head_dim;
  if (D <= 64) dispatch<T, 64>(a, stream);
  else if (D <= 128) dispatch<T, 128>(a, stream);
  else dispatch<T, 256>(a, stream);
}

template <>
void dispatch<float, 64>(attn::KernelArgs& a, int64_t stream) {
  launch_decode<float, 64>(a, stream);
  if (a.num_splits > 1) launch_combine<float>(a, stream);
}
template <>
void dispatch<float, 128>(attn::KernelArgs& a, int64_t stream) {
  launch_decode<float, 128>(a, stream);
  if (a.num_splits > 1) launch_combine<float>(a, stream);
}
template <>
void dispatch<float, 256>(attn::KernelArgs& a, int64_t stream) {
  launch_decode<float, 256>(a, stream);
  if (a.num_splits > 1) launch_combine<float>(a, stream);
}

}  // namespace
}  // namespace attn

void flash_attn_check(const AttnParams& p) {
  LLMK_CHECK(p.dtype == DType::F32 || p.dtype == DType::F16 || p.dtype == DType::BF16, TypeError,
             "q: expected float32, float16 or bfloat16, got ", dtype_name(p.dtype));
  LLMK_CHECK(p.head_dim % 8 == 0 && p.head_dim <= 256, NotImplementedError,
             "q: the CUDA attention kernels support head_dim multiples of 8 up to 256, got ",
             p.head_dim);
  LLMK_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0, ValueError,
             "k: num_kv_heads (", p.num_kv_heads, ") must divide num_heads (", p.num_heads, ")");
  LLMK_CHECK(!p.block_table || p.block_size >= 1, ValueError, "k_cache: block_size must be >= 1");
  LLMK_CHECK(p.num_heads <= kMaxGridYZ, NotImplementedError,
             "q: the CUDA attention kernels support at most 65535 heads (grid y), got ", p.num_heads);
  const size_t es = dtype_size(p.dtype);
  attn::check_rows_aligned("q", p.q, es, {p.q_row_stride, p.q_head_stride});
  attn::check_rows_aligned("out", p.out, es, {p.o_row_stride, p.o_head_stride});
  if (p.kv_quant != KvQuant::None) return;  // the quantised-cache kernel reads bytes: any alignment
  attn::check_rows_aligned("k", p.k, es,
                           {p.k_row_stride, p.k_head_stride, p.k_block_stride, p.k_batch_stride});
  attn::check_rows_aligned("v", p.v, es,
                           {p.v_row_stride, p.v_head_stride, p.v_block_stride, p.v_batch_stride});
}

void flash_attn(const AttnParams& p, int64_t stream) {
  flash_attn_check(p);
  attn::KernelArgs a;
  a.p = p;
  if (!p.cu_seqlens_q && a.p.max_seqlen_q < p.seqlen_q) a.p.max_seqlen_q = p.seqlen_q;
  if (p.batch == 0 || a.p.max_seqlen_q == 0 || p.num_heads == 0) return;
  if (p.kv_quant != KvQuant::None) {
    attn::launch_quant_kv(a.p, stream);
    check_launch("flash_attn (quantised KV cache)");
    return;
  }
  a.group = p.num_heads / p.num_kv_heads;
  a.page = attn::FastDiv::make(uint32_t(p.block_table ? p.block_size : 1));
  a.num_splits = p.num_splits > 1 && p.split_out && p.split_lse ? p.num_splits : 1;
  if (a.num_splits > attn::kMaxSplits) a.num_splits = attn::kMaxSplits;  // workspace is larger: fine

  switch (p.dtype) {
    case DType::F16: attn::dispatch_dim<__half>(a, stream); break;
    case DType::BF16: attn::dispatch_dim<__nv_bfloat16>(a, stream); break;
    default: attn::dispatch_dim<float>(a, stream); break;
  }
  check_launch("flash_attn");
}

}  // namespace gpu
}  // namespace llmk
