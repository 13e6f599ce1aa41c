// The sm_90a prefill kernel's test hooks (flash_prefill_sm90.cu), without device headers so the
// bindings can include them.
#pragma once

namespace llmk {
namespace gpu {
namespace attn {

// Select the kernel where it applies (on: an sm_90 device in a CUDA build, any call under SIMT) or
// never (off); returns the previous setting. Off at load unless LLMKERN_SM90_PREFILL=1: the Python
// layer turns it on once the kernel agreed with the mma.sync kernel on this GPU (ops/sm90_check.py).
bool use_sm90_prefill(bool on);
// Calls that ran on it so far.
long sm90_prefill_launches();

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
