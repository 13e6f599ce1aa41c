// The CUDA execution model on the CPU (llmkern._simt): what kernel sources see when the host
// compiler builds them. Blocks run one after another; the threads of a block are cooperative
// fibers that switch only at barriers and warp collectives (simt_runtime.cpp), so kernel code runs
// unchanged, deterministically, and without data races inside the emulator. Collectives exchange
// values through per-warp slots; ldmatrix and mma reproduce the PTX per-lane fragment layouts.
// A barrier or full-mask collective that part of a block/warp never reaches is reported as a
// RuntimeError naming the kernel and primitive, never a hang.
//
// Emulation rules a kernel must satisfy (all are CUDA's own rules, checked strictly here):
// - __syncthreads() is reached by every thread of the block, at the same source line (a thread
//   that returned early, or one waiting at another barrier, is an error);
// - a warp collective is reached by every non-exited lane of its mask with the same primitive;
//   exited lanes are not waited for, but shuffling a value from one is an error; ldmatrix and
//   mma need all 32 lanes; __activemask() is the set of non-exited lanes;
// - cp.async data lands in shared memory at the issuing thread's cp_async_wait (never earlier),
//   so a read before wait + __syncthreads sees stale data, as it may on a GPU;
// - dynamic shared memory starts filled with 0xff bytes; launches over 48 KiB need
//   llmk::simt::set_max_dynamic_smem first; mma accumulates exactly and rounds once to fp32.
// Fiber stacks are 128 KiB (LLMKERN_SIMT_STACK_KB) with a guard page.
#pragma once
#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// Blocks run sequentially on one OS thread, so one static instance per declaration is exactly
// "one copy per block".
#define __shared__ static

// ---- vector types and indices ----------------------------------------------------------------------
struct __align__(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct uint3 { unsigned x, y, z; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

inline int2 make_int2(int x, int y) { return {x, y}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// Set by the scheduler before each fiber runs (plain globals: launches are serialised).
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

#include "simt/simt_half.h"

// ---- runtime entry points (simt_runtime.cpp) -------------------------------------------------------
namespace llmk {
namespace simt {
namespace emu {

enum Op : int {
  kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp, kLdmatrix, kMma,
};
enum BarOp : int { kBarSync, kBarCount, kBarAnd, kBarOr };

int barrier(int op, int pred, const char* file, int line);
// A warp collective: waits until every lane of `mask` arrived, then returns this lane's result.
uint64_t warp_op(int op, unsigned mask, uint64_t value, int arg, const void* in, void* out,
                 const char* file, int line);
unsigned active_mask();
int lane();
int warp();
void* dynamic_smem();
void cp_async(void* smem_dst, const void* gmem_src, int src_bytes, const char* file, int line);
void cp_async_commit();
void cp_async_wait(int pending);
[[noreturn]] void fail(const char* what);

struct LaunchSpec {
  const char* name;
  const void* kernel;
  dim3 grid, block;
  size_t smem;
};
void run_grid(const LaunchSpec& spec, void (*body)(void*), void* ctx);
void set_max_dynamic_smem(const void* kernel, int bytes);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles take trivially copyable values of at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

template <typename... Params>
struct Launcher {
  void (*kernel)(Params...);
  LaunchSpec spec;
  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "LLMK_LAUNCH: wrong number of kernel arguments");
    // Arguments convert to the parameter types once, as in a CUDA launch; every thread then gets
    // its own by-value copy when it calls the kernel.
    struct Ctx {
      void (*kernel)(Params...);
      std::tuple<std::decay_t<Params>...> params;
    } ctx{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
    run_grid(spec, [](void* p) {
      Ctx* c = static_cast<Ctx*>(p);
      std::apply(c->kernel, c->params);
    }, &ctx);
  }
};

// The stream is evaluated (as under nvcc) and ignored: launches run synchronously, in order.
template <typename Stream, typename... Params>
Launcher<Params...> make_launcher(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block,
                                  size_t smem, const Stream&) {
  return {kernel, {name, reinterpret_cast<const void*>(kernel), grid, block, smem}};
}

}  // namespace emu
}  // namespace simt
}  // namespace llmk

#define LLMK_LAUNCH(kernel, grid, block, smem, stream) \
  ::llmk::simt::emu::make_launcher(kernel, #kernel, dim3(grid), dim3(block), static_cast<size_t>(smem), stream)

// ---- barriers and warp collectives -----------------------------------------------------------------
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::llmk::simt::emu::barrier(::llmk::simt::emu::kBarSync, 0, file, line);
}
inline int __syncthreads_count(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::llmk::simt::emu::barrier(::llmk::simt::emu::kBarCount, pred != 0, file, line);
}
inline int __syncthreads_and(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::llmk::simt::emu::barrier(::llmk::simt::emu::kBarAnd, pred != 0, file, line);
}
inline int __syncthreads_or(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::llmk::simt::emu::barrier(::llmk::simt::emu::kBarOr, pred != 0, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::llmk::simt::emu::warp_op(::llmk::simt::emu::kSyncWarp, mask, 0, 0, nullptr, nullptr, file, line);
}
inline unsigned __activemask() { return ::llmk::simt::emu::active_mask(); }

// Shuffle arg: low 8 bits lane/delta/lane-mask operand (PTX uses its low 5 bits), next bits width.
#define LLMK_SIMT_SHFL(fn, op, ArgT)                                                             \
  template <typename T>                                                                          \
  T fn(unsigned mask, T var, ArgT operand, int width = 32, const char* file = __builtin_FILE(), \
       int line = __builtin_LINE()) {                                                            \
    using namespace ::llmk::simt::emu;                                                           \
    return from_bits<T>(warp_op(op, mask, to_bits(var),                                         \
                                (static_cast<int>(operand) & 0xff) | (width << 8), nullptr,     \
                                nullptr, file, line));                                           \
  }
LLMK_SIMT_SHFL(__shfl_sync, kShflIdx, int)
LLMK_SIMT_SHFL(__shfl_up_sync, kShflUp, unsigned)
LLMK_SIMT_SHFL(__shfl_down_sync, kShflDown, unsigned)
LLMK_SIMT_SHFL(__shfl_xor_sync, kShflXor, int)
#undef LLMK_SIMT_SHFL

inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  using namespace ::llmk::simt::emu;
  return static_cast<unsigned>(warp_op(kBallot, mask, pred != 0, 0, nullptr, nullptr, file, line));
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::llmk::simt::emu;
  return static_cast<int>(warp_op(kAny, mask, pred != 0, 0, nullptr, nullptr, file, line));
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::llmk::simt::emu;
  return static_cast<int>(warp_op(kAll, mask, pred != 0, 0, nullptr, nullptr, file, line));
}

// ---- atomics: fibers never switch inside one, so a plain read-modify-write is atomic ------------
inline int atomicAdd(int* a, int v) {
  const int old = *a;
  *a = static_cast<int>(static_cast<unsigned>(old) + static_cast<unsigned>(v));  // wraps, as on GPU
  return old;
}
inline unsigned atomicAdd(unsigned* a, unsigned v) { const unsigned o = *a; *a = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  const unsigned long long o = *a;
  *a = o + v;
  return o;
}
inline float atomicAdd(float* a, float v) { const float o = *a; *a = o + v; return o; }
inline int atomicMax(int* a, int v) { const int o = *a; *a = o > v ? o : v; return o; }
inline unsigned atomicMax(unsigned* a, unsigned v) { const unsigned o = *a; *a = o > v ? o : v; return o; }
inline int atomicMin(int* a, int v) { const int o = *a; *a = o < v ? o : v; return o; }
inline unsigned atomicMin(unsigned* a, unsigned v) { const unsigned o = *a; *a = o < v ? o : v; return o; }
template <typename T>
T atomicCAS(T* a, T compare, T val) {
  static_assert(std::is_integral<T>::value && (sizeof(T) == 4 || sizeof(T) == 8), "atomicCAS: int, unsigned or unsigned long long");
  const T o = *a;
  if (o == compare) *a = val;
  return o;
}
template <typename T>
T atomicExch(T* a, T val) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomicExch: 32- or 64-bit values");
  const T o = *a;
  *a = val;
  return o;
}

// ---- math intrinsics (fast-math forms are the precise host functions here) ---------------------
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// ---- layer functions (llmk::simt; PTX under nvcc, see common/simt.h) ------------------------------------
#define LLMK_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::llmk::simt::emu::dynamic_smem())

namespace llmk {
namespace simt {

inline int lane_id() { return emu::lane(); }
inline int warp_id() { return emu::warp(); }

template <typename Kernel>
inline void set_max_dynamic_smem(Kernel* kernel, int bytes) {
  emu::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

inline void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes = 16,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::cp_async(smem_dst, gmem_src, src_bytes, file, line);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait<N>: N >= 0");
  emu::cp_async_wait(N);
}
inline void cp_async_wait_all() {
  emu::cp_async_commit();
  emu::cp_async_wait(0);
}

// ldmatrix arg: number of 8x8 matrices | 8 when transposed.
#define LLMK_SIMT_LDMATRIX(fn, num, trans)                                                       \
  inline void fn(uint32_t* regs, const void* smem_row_addr, const char* file = __builtin_FILE(), \
                 int line = __builtin_LINE()) {                                                  \
    emu::warp_op(emu::kLdmatrix, 0xffffffffu, 0, (num) | ((trans) ? 8 : 0), smem_row_addr, regs, \
                 file, line);                                                                    \
  }
LLMK_SIMT_LDMATRIX(ldmatrix_x1, 1, false)
LLMK_SIMT_LDMATRIX(ldmatrix_x2, 2, false)
LLMK_SIMT_LDMATRIX(ldmatrix_x4, 4, false)
LLMK_SIMT_LDMATRIX(ldmatrix_x1_trans, 1, true)
LLMK_SIMT_LDMATRIX(ldmatrix_x2_trans, 2, true)
LLMK_SIMT_LDMATRIX(ldmatrix_x4_trans, 4, true)
#undef LLMK_SIMT_LDMATRIX

struct MmaOperands {
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
};
// mma arg: 0 = bf16 inputs, 1 = fp16 inputs.
inline void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const MmaOperands in{a, b, c};
  emu::warp_op(emu::kMma, 0xffffffffu, 0, 0, &in, d, file, line);
}
inline void mma_m16n8k16_f16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const MmaOperands in{a, b, c};
  emu::warp_op(emu::kMma, 0xffffffffu, 0, 1, &in, d, file, line);
}

}  // namespace simt
}  // namespace llmk
