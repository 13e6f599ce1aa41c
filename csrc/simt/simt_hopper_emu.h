// The Hopper layer (common/simt_hopper.h) under the SIMT emulator (simt_hopper.cpp):
// - shared-memory addresses are offsets into the launch's dynamic shared memory (mbarriers,
//   TMA destinations and wgmma operands must live there; the buffer is 1024-byte aligned, so
//   the swizzle patterns, which the hardware takes from address bits, are the same);
// - an mbarrier is emulator state keyed by its address: mbar_init'ed once per block, phases
//   complete when the pending arrivals and the transaction count both reach zero;
// - a TMA load lands (and counts its bytes against its mbarrier) only when some thread tests or
//   waits on that mbarrier, so reading the destination without the wait sees stale data;
//   copies never waited for are reported when the block ends;
// - wgmma is a collective of the 128 threads of a warpgroup; its result lands in the
//   accumulator registers at wgmma_wait (until then they read NaN), products are exact and sums
//   are rounded once to fp32; a thread that exits with results never waited for is an error;
// - named barriers count threads; setmaxnreg does nothing.
#pragma once
#include <cstdint>
#include <type_traits>

namespace llmk {
namespace simt {

// The emulator's tensor map: what cuTensorMapEncodeTiled takes, kept as is (innermost dim first).
struct alignas(64) TensorMap {
  const void* base = nullptr;
  int rank = 0, elem_bytes = 0, swizzle = 0;
  uint64_t dims[5] = {};
  uint64_t strides[5] = {};  // bytes; strides[0] is the element size
  uint32_t box[5] = {};
};

bool make_tensor_map(TensorMap* map, const void* base, int elem_bytes, int rank, const uint64_t* dims,
                     const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes);

namespace emu {

uint32_t smem_offset(const void* p, const char* what, const char* file, int line);
void mbar_init(void* bar, int count, const char* file, int line);
void mbar_arrive(void* bar, uint32_t expect_tx, const char* file, int line);
bool mbar_try_wait(void* bar, int parity, bool block, const char* file, int line);
void tma_load(void* dst, const TensorMap* map, void* bar, int rank, const int* coords, const char* file,
              int line);
struct WgmmaArgs {
  int n = 0, trans_b = 0, scale_d = 1;
  bool fp16 = false;
  uint64_t desc_a = 0, desc_b = 0;
  const uint32_t* a = nullptr;  // A in registers (rs), else desc_a (ss)
  float* d = nullptr;
};
void wgmma(const WgmmaArgs& args, const char* file, int line);
void wgmma_fence(const char* file, int line);
void wgmma_commit();
void wgmma_wait(int pending, const char* file, int line);
void named_bar(int id, int threads, bool sync, const char* file, int line);

}  // namespace emu

#define LLMK_SIMT_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

inline unsigned smem_addr(const void* p, LLMK_SIMT_SITE) { return emu::smem_offset(p, "shared address", file, line); }

inline void mbar_init(uint64_t* bar, int count, LLMK_SIMT_SITE) { emu::mbar_init(bar, count, file, line); }
inline void mbar_arrive(uint64_t* bar, LLMK_SIMT_SITE) { emu::mbar_arrive(bar, 0, file, line); }
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes, LLMK_SIMT_SITE) {
  emu::mbar_arrive(bar, bytes, file, line);
}
inline bool mbar_try_wait(uint64_t* bar, int parity, LLMK_SIMT_SITE) {
  return emu::mbar_try_wait(bar, parity, false, file, line);
}
inline void mbar_wait(uint64_t* bar, int parity, LLMK_SIMT_SITE) { emu::mbar_try_wait(bar, parity, true, file, line); }
inline void fence_barrier_init() {}
inline void fence_proxy_async() {}

inline void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, LLMK_SIMT_SITE) {
  const int c[2] = {c0, c1};
  emu::tma_load(dst, map, bar, 2, c, file, line);
}
inline void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, LLMK_SIMT_SITE) {
  const int c[3] = {c0, c1, c2};
  emu::tma_load(dst, map, bar, 3, c, file, line);
}
inline void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                     LLMK_SIMT_SITE) {
  const int c[4] = {c0, c1, c2, c3};
  emu::tma_load(dst, map, bar, 4, c, file, line);
}

inline void wgmma_fence(LLMK_SIMT_SITE) { emu::wgmma_fence(file, line); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N>
inline void wgmma_fence_operand(float*) {}
template <int N>
inline void wgmma_wait(LLMK_SIMT_SITE) {
  static_assert(N >= 0 && N <= 7, "wgmma_wait<N>: N in [0, 7]");
  emu::wgmma_wait(N, file, line);
}

template <typename T>
constexpr bool wgmma_fp16() {
  static_assert(sizeof(T) == 2, "wgmma: fp16 or bf16 inputs");
  return std::is_same<T, __half>::value;
}
template <typename T, int N, int kTransB>
inline void wgmma_ss(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d, LLMK_SIMT_SITE) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma: N a multiple of 8 in [8, 256]");
  emu::WgmmaArgs w;
  w.n = N, w.trans_b = kTransB, w.scale_d = scale_d, w.fp16 = wgmma_fp16<T>();
  w.desc_a = desc_a, w.desc_b = desc_b, w.d = d;
  emu::wgmma(w, file, line);
}
template <typename T, int N, int kTransB>
inline void wgmma_rs(float* d, const uint32_t* a, uint64_t desc_b, int scale_d, LLMK_SIMT_SITE) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma: N a multiple of 8 in [8, 256]");
  emu::WgmmaArgs w;
  w.n = N, w.trans_b = kTransB, w.scale_d = scale_d, w.fp16 = wgmma_fp16<T>();
  w.a = a, w.desc_b = desc_b, w.d = d;
  emu::wgmma(w, file, line);
}

inline void named_bar_sync(int id, int threads, LLMK_SIMT_SITE) { emu::named_bar(id, threads, true, file, line); }
inline void named_bar_arrive(int id, int threads, LLMK_SIMT_SITE) { emu::named_bar(id, threads, false, file, line); }
template <int R>
inline void setmaxnreg_inc() {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: a multiple of 8 in [24, 256]");
}
template <int R>
inline void setmaxnreg_dec() {
  static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: a multiple of 8 in [24, 256]");
}

#undef LLMK_SIMT_SITE

}  // namespace simt
}  // namespace llmk
