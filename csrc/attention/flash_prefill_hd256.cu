// Tensor-core flash-attention prefill, head dims 136..256: 64 query rows x 32 keys per step, 4 warps of 16 rows.
// (One file per head-dim class so that the CUDA build compiles them in parallel.)
#include "attention/flash_prefill_launch.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template void launch_prefill<__half, 256>(KernelArgs a, int64_t stream);
template void launch_prefill<__nv_bfloat16, 256>(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
