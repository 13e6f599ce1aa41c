// Backend and SIMD-level dispatch for op front ends.
//
// Every kernel entry point exists once per backend namespace with the same name and parameters:
//   llmk::cpu_scalar / cpu_avx2 / cpu_avx512 :: name   (the *_cpu.cpp files, one build per level)
//   llmk::gpu :: name                                  (the *.cu files; host-compiled in _simt)
// LLMK_DECLARE_KERNEL declares all of them; LLMK_RUN picks one from the tensor's device and the
// CPU's SIMD level.
#pragma once
#include <cstdint>

#include "common/errors.h"
#include "common/tensor.h"

namespace llmk {

// Amx is the AVX-512 build plus AMX tile kernels (Intel Sapphire Rapids and later): the cpu_avx512
// objects run it, their GEMM-shaped kernels switching to tiles when amx_mode() is not Off.
enum class CpuIsa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Amx = 3 };
CpuIsa cpu_isa();               // best level this CPU supports, capped by LLMKERN_CPU_ISA
const char* cpu_isa_name(CpuIsa isa);
CpuIsa cpu_isa_supported();     // best level this CPU supports

// How the tile kernels run: on the CPU's AMX units (CPUID AMX-TILE + AMX-BF16, and Linux granted
// this process the tile state), on a software model of the tiles (LLMKERN_CPU_ISA=amx-emulated: any
// AVX-512 CPU, for tests; slow), or not at all.
enum class AmxMode : int { Off = 0, Hardware = 1, Emulated = 2 };
AmxMode amx_mode();
// The int8 tiles (tdpbsud, the quantised projections): amx_mode() where the CPU also has AMX-INT8
// (CPUID.7.0:EDX[25]; a CPU may have AMX-BF16 without it) and its tiles agree with their model.
AmxMode amx_int8_mode();
const char* amx_mode_name(AmxMode mode);
bool amx_compiled();            // this build holds tile kernels (x86-64, a compiler with -mamx-tile)
// The CPU rounds fp32 to bf16 in one instruction (AVX512-BF16's vcvtneps2bf16: every AMX CPU, Zen 4):
// the AVX-512 build's bf16 GEMM epilogues and norms then store with vec::store_bf16<true>, whose
// bits equal the software rounding's. LLMKERN_BF16_CVT=0 keeps the software rounding (tests).
bool cpu_bf16_cvt();
// CPUID has AVX512-BF16 and the environment variable env_off is not "0" (the switches that force
// each bf16 kernel's other path for tests).
bool cpu_avx512_bf16(const char* env_off);
// The bf16 GEMMs of up to kStreamRows rows on AVX512_BF16 (decode projections, bound by reading W)
// prefetch each work item's next panel group while they compute one, as larger GEMMs do, on Intel
// CPUs: a 2-vCPU Xeon's batch-1 bf16 projections ran 8-17% faster with it (its fp32 ones did not
// change, and stay one stream). Elsewhere each thread reads W as one sequential stream.
// LLMKERN_GEMV_PREFETCH=1 / 0 forces either; the results are the same bits either way.
bool cpu_bf16_gemv_prefetch();

}  // namespace llmk

#define LLMK_DECLARE_KERNEL(name, params)       \
  namespace llmk {                              \
  namespace cpu_scalar { void name params; }    \
  namespace cpu_avx2 { void name params; }      \
  namespace cpu_avx512 { void name params; }    \
  namespace gpu { void name params; }          \
  }

#if LLMK_MULTI_ISA
#define LLMK_CPU_CALL(name, ...)                                                  \
  do {                                                                            \
    switch (::llmk::cpu_isa()) {                                                  \
      case ::llmk::CpuIsa::Amx:                                                   \
      case ::llmk::CpuIsa::Avx512: ::llmk::cpu_avx512::name(__VA_ARGS__); break;  \
      case ::llmk::CpuIsa::Avx2: ::llmk::cpu_avx2::name(__VA_ARGS__); break;      \
      default: ::llmk::cpu_scalar::name(__VA_ARGS__); break;                      \
    }                                                                             \
  } while (0)
#else
#define LLMK_CPU_CALL(name, ...) ::llmk::cpu_scalar::name(__VA_ARGS__)
#endif

#if defined(LLMK_SIMT)
// The emulator runs the CUDA sources on host memory: every call goes to the CUDA entry point.
#define LLMK_RUN(device_tensor, name, ...) ::llmk::gpu::name(__VA_ARGS__)
#elif defined(LLMK_WITH_CUDA)
#define LLMK_RUN(device_tensor, name, ...)                                   \
  do {                                                                       \
    if ((device_tensor).is_cuda()) ::llmk::gpu::name(__VA_ARGS__);          \
    else LLMK_CPU_CALL(name, __VA_ARGS__);                                   \
  } while (0)
#else
#define LLMK_RUN(device_tensor, name, ...)                                               \
  do {                                                                                   \
    LLMK_CHECK(!(device_tensor).is_cuda(), RuntimeError,                                 \
               "llmkern was built without CUDA; rebuild with nvcc on PATH (LLMKERN_CUDA=ON)"); \
    LLMK_CPU_CALL(name, __VA_ARGS__);                                                    \
  } while (0)
#endif

// For ops whose CUDA kernel does not exist yet: CPU dispatch, NotImplementedError elsewhere
// (including the SIMT emulator, which only runs CUDA sources).
#if defined(LLMK_SIMT)
#define LLMK_RUN_CPU(device_tensor, name, ...) \
  throw ::llmk::NotImplementedError(#name ": no CUDA kernel yet (SIMT emulation unavailable)")
#else
#define LLMK_RUN_CPU(device_tensor, name, ...)                                           \
  do {                                                                                   \
    LLMK_CHECK(!(device_tensor).is_cuda(), NotImplementedError, #name,                   \
               ": no CUDA kernel yet; pass CPU tensors");                               \
    LLMK_CPU_CALL(name, __VA_ARGS__);                                                    \
  } while (0)
#endif
