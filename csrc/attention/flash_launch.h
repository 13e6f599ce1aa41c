// Host-side launchers of the CUDA attention kernels, one per (dtype, padded head dim), defined
// in flash_prefill_hd*.cu, flash_decode.cu, flash_fp32.cu and flash_combine.cu and picked by
// flash_attn.cu. Head dims are padded up to 64 / 128 / 256 (the extra columns are zero-filled
// in shared memory and skipped in the math), so three instantiations cover every multiple of 8.
#pragma once
#include <cstdint>

#include "attention/attn_device.cuh"
#include "common/grid.h"

namespace llmk {
namespace gpu {
namespace attn {

constexpr int kMaxSplits = 128;  // split-KV partitions per sequence, at most
constexpr int kDecodeWarps = 4;  // decode kernel: warps per CTA (each takes every 4th key tile)
constexpr int kDecodeRows = 16;  // decode kernel: query rows (positions x group heads) per CTA

// Query rows per CTA of the tensor-core prefill kernel, per padded head dim.
constexpr int prefill_block_m(int padded_head_dim) { return padded_head_dim <= 128 ? 128 : 64; }

// True the first time `kernel` is asked about on the current device.
bool first_use_on_device(const void* kernel);

// Opt `kernel` in to `bytes` of dynamic shared memory (needed above 48 KiB), once per device.
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, int bytes) {
  if (bytes > 48 * 1024 && first_use_on_device(reinterpret_cast<const void*>(kernel)))
    llmk::simt::set_max_dynamic_smem(kernel, bytes);
}

// Tensor-core prefill (fp16 / bf16). Sets a.m_blocks from the row count and launches.
template <typename T, int kD>
void launch_prefill(KernelArgs a, int64_t stream);

// Decode-shaped kernel: tensor cores for fp16 / bf16, CUDA cores for fp32.
template <typename T, int kD>
void launch_decode(KernelArgs a, int64_t stream);

// Attention over a quantised (fp8 / int8) KV cache, every shape, no split (flash_quant_kv.cu).
void launch_quant_kv(const AttnParams& p, int64_t stream);

// Merge of split-KV partials into out (+ LSE).
template <typename T>
void launch_combine(const KernelArgs& a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
