// The sm_90a prefill path (flash_prefill_sm90.cu): whether it takes a call, and its launcher.
#pragma once
#include <cstdint>

#include "attention/attn_device.cuh"
#include "attention/sm90_switch.h"

namespace llmk {
namespace gpu {
namespace attn {

// True when this call can run on the wgmma + TMA kernel here: fp16/bf16, head_dim exactly 64, 128
// or 256, dense K/V with known row counts or a paged cache whose page size is a multiple of 8 that
// divides the key tile (128; 64 at head dim 256) or a multiple of it, no split-KV (softcap, ALiBi, windows and GQA, packed or not,
// are taken), and sm_90 with a 90a build (CUDA) or the emulation switch on (SIMT).
bool sm90_prefill_selected(const KernelArgs& a, int padded_head_dim);
// Launches it; false (nothing launched) when TMA cannot describe the tensors' strides.
template <typename T, int kD>
bool launch_prefill_sm90(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
