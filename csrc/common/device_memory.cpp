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

// A GPU whose architecture the build has neither machine code nor usable PTX for fails every
// launch with cudaErrorNoKernelImageForDevice (or a PTX error when the PTX is newer than the driver):
// say which GPU and what the build carries, and what to do.
static void throw_no_kernel_image(cudaError_t e, const char* what) {
  int dev = 0, major = 0, minor = 0;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  throw RuntimeError(str_cat(what, ": CUDA error: ", cudaGetErrorString(e), ". This llmkern build has no kernel "
                             "for GPU ", dev, " (compute capability ", major, ".", minor, "): it carries machine code "
                             "for sm_{", LLMK_CUDA_SASS, "} and PTX for compute_{", LLMK_CUDA_PTX, "} (CUDA ",
                             LLMK_CUDA_TOOLKIT, "; PTX needs a driver at least as new). Update the driver, or "
                             "build from source with LLMKERN_CUDA_ARCHS including ", major, minor,
                             " (docs/wheels.md)"));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorUnsupportedPtxVersion ||
      e == cudaErrorInvalidKernelImage)
    throw_no_kernel_image(e, what);
  throw_on(e, what);
}

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
