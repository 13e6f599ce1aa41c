// Whether the sm_90a code paths (wgmma + TMA kernels) can run: compiled in (LLMK_HAS_SM90A, set by
// CMake when LLMKERN_CUDA_ARCHS names 90a) and the current device is compute capability 9.0.
#pragma once

namespace llmk {
namespace gpu {

bool device_is_sm90();  // CUDA builds only (tensor_map.cu)

}  // namespace gpu
}  // namespace llmk
