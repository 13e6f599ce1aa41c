// The SIMT portability layer: kernel sources include this and nothing CUDA-specific beyond it.
// Under nvcc it is the native CUDA toolkit plus a few layer functions in inline PTX (no overhead);
// under the host compiler (llmkern._simt) it is the fiber-based emulation of the CUDA execution
// model in simt/simt_emu.h. The API contract (names and meaning) is the same on both sides:
//   LLMK_LAUNCH(kernel, grid, block, smem_bytes, stream)(args...)
//   LLMK_DYNAMIC_SMEM(T, name);                 T* name -> the launch's dynamic shared memory
//   llmk::simt::lane_id(), warp_id()
//   llmk::simt::set_max_dynamic_smem(kernel, bytes)   host side, before launches > 48 KiB
//   llmk::simt::cp_async_16(smem, gmem, src_bytes = 16), cp_async_commit(), cp_async_wait<N>(),
//               cp_async_wait_all()
//   llmk::simt::ldmatrix_x1/_x2/_x4[_trans](uint32_t* regs, const void* smem_row_addr)
//   llmk::simt::mma_m16n8k16_bf16 / _f16(float* d, const uint32_t* a, const uint32_t* b, const float* c)
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// kernel<<<grid, block, smem, stream>>>(args...) spelled so that g++ can parse it too.
#define LLMK_LAUNCH(kernel, grid, block, smem, stream) \
  kernel<<<(grid), (block), (smem), reinterpret_cast<cudaStream_t>(stream)>>>

#define LLMK_DYNAMIC_SMEM(T, name)                                     \
  extern __shared__ __align__(16) unsigned char llmk_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(llmk_dynamic_smem_)

namespace llmk {
namespace simt {

__device__ __forceinline__ int lane_id() {
  unsigned r;
  asm("mov.u32 %0, %%laneid;" : "=r"(r));
  return static_cast<int>(r);
}
__device__ __forceinline__ int warp_id() {
  return static_cast<int>((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) >> 5);
}

// Launches asking for more than 48 KiB of dynamic shared memory need this opt-in first.
template <typename Kernel>
inline void set_max_dynamic_smem(Kernel* kernel, int bytes) {
  (void)cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// cp.async.cg: 16 bytes global -> shared, bypassing L1; bytes past src_bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x1(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d = a x b + c; a: 16x16 row-major fragment (4 regs), b: 16x8 column fragment (2 regs), fp32 c/d.
__device__ __forceinline__ void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_f16(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

}  // namespace simt
}  // namespace llmk

#else
#include "simt/simt_emu.h"
#endif
