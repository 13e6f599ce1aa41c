// fp32 attention on CUDA cores (every shape: prefill, varlen, paged, decode): the decode
// kernel's skeleton (16 query rows of one kv head per CTA, warps splitting the keys) with the
// FmaTile math. See flash_decode.cuh.
#include "attention/flash_decode_launch.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template void launch_decode<float, 64>(KernelArgs a, int64_t stream);
template void launch_decode<float, 128>(KernelArgs a, int64_t stream);
template void launch_decode<float, 256>(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
