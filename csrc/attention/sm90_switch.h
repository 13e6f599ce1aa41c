// The sm_90a prefill kernel's test hooks (flash_prefill_sm90.cu), without device headers so the
// bindings can include them.
#pragma once

namespace llmk {
namespace gpu {
namespace attn {

// SIMT: select the kernel where it applies (on) or never (off); returns the previous setting.
// (CUDA builds select it by the device alone; the setting has no effect there.)
bool set_sm90_prefill_emulation(bool on);
// Calls that ran on it so far.
long sm90_prefill_launches();

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
