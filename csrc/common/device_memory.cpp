#include "common/device_memory.h"

#include "common/errors.h"

#if defined(LLMK_WITH_CUDA) && !defined(LLMK_SIMT)
#include <cuda_runtime.h>

namespace llmk {

static void throw_on(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(str_cat(what, ": CUDA error: ", cudaGetErrorString(e)));
}

bool cuda_compiled() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver: clear the sticky error, report zero devices
    return 0;
  }
  return n;
}

void copy_device_to_host(void* dst, const void* src, size_t bytes) {
  throw_on(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "device-to-host copy");
}

void copy_async(void* dst, const void* src, size_t bytes, int64_t stream) {
  throw_on(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                           reinterpret_cast<cudaStream_t>(stream)),
           "cudaMemcpyAsync");
}

void check_launch(const char* what) { throw_on(cudaGetLastError(), what); }

}  // namespace llmk

#else

#include <cstring>

namespace llmk {

bool cuda_compiled() {
#if defined(LLMK_SIMT)
  return true;
#else
  return false;
#endif
}
int cuda_device_count() { return 0; }
// In the SIMT emulator "device" memory is host memory.
void copy_device_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void copy_async(void* dst, const void* src, size_t bytes, int64_t) { std::memmove(dst, src, bytes); }
void check_launch(const char*) {}

}  // namespace llmk

#endif
