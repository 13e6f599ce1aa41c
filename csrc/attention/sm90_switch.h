// The sm_90a prefill kernel's test hooks (flash_prefill_sm90.cu), without device headers so the
// bindings can include them.
#pragma once

namespace llmk {
namespace gpu {
namespace attn {

// Select the kernel where it applies (on: an sm_90 device in a CUDA build, any call under SIMT) or
// never (off); returns the previous setting. Off by default: the kernel has run only under the
// emulator so far; a CUDA process also turns it on with LLMKERN_SM90_PREFILL=1.
bool use_sm90_prefill(bool on);
// Calls that ran on it so far.
long sm90_prefill_launches();

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
