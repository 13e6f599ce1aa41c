// Portability macros shared by host-only, CPU-kernel, CUDA and SIMT-emulated translation units.
#pragma once

#if defined(__CUDACC__)
#define LLMK_HD __host__ __device__ __forceinline__
#define LLMK_DEVICE __device__ __forceinline__
#else
#define LLMK_HD inline __attribute__((always_inline))
#define LLMK_DEVICE inline __attribute__((always_inline))
#endif

#define LLMK_ALWAYS_INLINE inline __attribute__((always_inline))

// CPU kernel files are compiled once per SIMD level with LLMK_CPU_NS set (cpu_scalar, cpu_avx2,
// cpu_avx512). Everything a kernel file defines, and every header of math it includes, lives in
// that namespace, so each SIMD level gets its own symbols and the linker can never hand an
// AVX-512 copy of a helper to the scalar path. Refer to such helpers unqualified: they are
// llmk::cpu_<level>::f in CPU builds and llmk::f in CUDA builds.
#if defined(LLMK_CPU_NS)
#define LLMK_NS_BEGIN namespace llmk { namespace LLMK_CPU_NS {
#define LLMK_NS_END } }
#else
#define LLMK_NS_BEGIN namespace llmk {
#define LLMK_NS_END }
#endif
