// Hopper (sm_90a) additions to the SIMT layer: warpgroup MMA (wgmma), TMA tensor copies,
// mbarriers with transaction counts, named barriers and register reallocation. Kernel sources
// include this next to common/simt.h. Under nvcc the functions are the PTX instructions (the
// bodies exist only when compiling for sm_90a; other architectures get a trap, and their
// kernels must not call them); under the host compiler they are the emulation in
// simt/simt_hopper_emu.h, which runs the same protocol across the emulated warpgroup:
//   mbar_init(bar, count), mbar_arrive(bar), mbar_arrive_expect_tx(bar, bytes),
//   mbar_try_wait(bar, parity) -> bool, mbar_wait(bar, parity)        bar: uint64_t in shared memory
//   fence_barrier_init(), fence_proxy_async()
//   tma_load(dst_smem, map, bar, c0[, c1[, c2[, c3]]])               map: a TensorMap parameter
//   make_tensor_map(&map, base, elem_bytes, rank, dims, strides_bytes, box, swizzle_bytes)  (host)
//   wgmma_desc(smem, lbo_bytes, sbo_bytes, swizzle_bytes) -> uint64_t
//   wgmma_fence(), wgmma_commit(), wgmma_wait<N>(), wgmma_fence_operand<N>(d)
//   wgmma_ss<T, N, kTransB>(d, desc_a, desc_b, scale_d)   D[64xN] (+)= A[64x16] B[16xN], fp32 D
//   wgmma_rs<T, N, kTransB>(d, a_regs, desc_b, scale_d)    A from registers (mma A fragment layout)
//   named_bar_sync(id, threads), named_bar_arrive(id, threads)
//   setmaxnreg_inc<R>(), setmaxnreg_dec<R>()
// Fragment layout of D (PTX ISA, wgmma .m64nNk16): warp w of the warpgroup holds rows 16w + g and
// 16w + g + 8 (g = lane / 4); d[4i + e] is column 8i + 2 (lane % 4) + (e & 1) of row 16w + g + 8 (e >> 1).
#pragma once
#include <cstdint>

#include "common/simt.h"

#if defined(__CUDACC__)
#include <cuda.h>

// The sm_90a-only bodies: the feature macro is defined only for the arch-specific target.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMK_SM90A 1
#endif

namespace llmk {
namespace simt {

using TensorMap = CUtensorMap;

// Host: encode a tiled tensor map (through the driver, fetched from the runtime: no libcuda link).
// dims/strides innermost first; strides_bytes[i] is the stride of dim i + 1. Returns false on failure.
bool make_tensor_map(TensorMap* map, const void* base, int elem_bytes, int rank, const uint64_t* dims,
                     const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes);

#if defined(LLMK_SM90A)
#define LLMK_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define LLMK_SM90_ASM(...) __trap()
#endif

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  LLMK_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  LLMK_SM90_ASM("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  LLMK_SM90_ASM("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
                "r"(bytes)
                : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, int parity) {
  uint32_t ok = 0;
  LLMK_SM90_ASM(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
__device__ __forceinline__ void fence_barrier_init() {
  LLMK_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Generic-proxy writes to shared memory become visible to wgmma / TMA (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  LLMK_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1) {
  LLMK_SM90_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  LLMK_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                         int c3) {
  LLMK_SM90_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void wgmma_fence() { LLMK_SM90_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Pins accumulator registers in place around wgmma issue / wait points, so the compiler moves no
// read or write of them across (which would make ptxas serialise the wgmma pipeline).
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void wgmma_commit() { LLMK_SM90_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  LLMK_SM90_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  LLMK_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  LLMK_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

}  // namespace simt
}  // namespace llmk

#include "common/simt_wgmma_ptx.h"

namespace llmk {
namespace simt {

template <typename T, int N, int kTransB>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if defined(LLMK_SM90A)
  WgmmaPtx<T, N>::template ss<kTransB>(d, desc_a, desc_b, scale_d);
#else
  __trap();
#endif
}
template <typename T, int N, int kTransB>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t* a, uint64_t desc_b, int scale_d) {
#if defined(LLMK_SM90A)
  WgmmaPtx<T, N>::template rs<kTransB>(d, a, desc_b, scale_d);
#else
  __trap();
#endif
}

}  // namespace simt
}  // namespace llmk

#else
#include "simt/simt_hopper_emu.h"
#endif

namespace llmk {
namespace simt {

// Shared-memory matrix descriptor (PTX ISA "matrix descriptor"): start address, leading and
// stride byte offsets (all >> 4), swizzle mode in bits 62-63 (1: 128 B, 2: 64 B, 3: 32 B).
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, int lbo_bytes, int sbo_bytes, int swizzle_bytes) {
  const uint64_t mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
  return uint64_t((smem_addr(smem) & 0x3ffff) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3fff) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3fff) << 32) | (mode << 62);
}

}  // namespace simt
}  // namespace llmk
