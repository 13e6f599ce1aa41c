// Decode-shaped attention on tensor cores (fp16 / bf16): flash_attn_with_kvcache decode and
// multi-token verification, short varlen queries. See flash_decode.cuh.
#include "attention/flash_decode_launch.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template void launch_decode<__half, 64>(KernelArgs a, int64_t stream);
template void launch_decode<__half, 128>(KernelArgs a, int64_t stream);
template void launch_decode<__half, 256>(KernelArgs a, int64_t stream);
template void launch_decode<__nv_bfloat16, 64>(KernelArgs a, int64_t stream);
template void launch_decode<__nv_bfloat16, 128>(KernelArgs a, int64_t stream);
template void launch_decode<__nv_bfloat16, 256>(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
