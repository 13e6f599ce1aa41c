// The SIMT portability layer: kernel sources include this and nothing CUDA-specific beyond it.
// Under nvcc it is the native CUDA toolkit; under the host compiler (llmkern._simt) it is the
// fiber-based emulation of the CUDA execution model in simt_emu.h.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// kernel<<<grid, block, smem, stream>>>(args...) spelled so that g++ can parse it too.
#define LLMK_LAUNCH(kernel, grid, block, smem, stream) \
  kernel<<<(grid), (block), (smem), reinterpret_cast<cudaStream_t>(stream)>>>
#else
#include "common/simt_emu.h"
#endif
