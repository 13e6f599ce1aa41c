// The few host-side CUDA runtime calls llmkern makes outside kernels. Without CUDA they throw.
#pragma once
#include <cstddef>
#include <cstdint>

namespace llmk {

bool cuda_compiled();
int cuda_device_count();  // 0 when no driver/GPU is present (never throws)
// Synchronous; used only by LLMKERN_DEBUG_CHECKS=1 validation.
void copy_device_to_host(void* dst, const void* src, size_t bytes);
// Asynchronous on `stream` (cudaMemcpyDefault: the runtime infers the direction).
void copy_async(void* dst, const void* src, size_t bytes, int64_t stream);
// Raise a RuntimeError naming `what` if the last launch failed.
void check_launch(const char* what);

}  // namespace llmk
