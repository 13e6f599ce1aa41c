// Tensor-core flash-attention prefill, head dims 72..128: 128 query rows x 64 keys per step, 4 warps of 32 rows.
// (One file per head-dim class so that the CUDA build compiles them in parallel.)
#include "attention/flash_prefill_launch.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template void launch_prefill<__half, 128>(KernelArgs a, int64_t stream);
template void launch_prefill<__nv_bfloat16, 128>(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
