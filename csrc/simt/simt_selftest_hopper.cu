// Self-test kernels of the Hopper layer (common/simt_hopper.h): wgmma through TMA-loaded shared-memory
// operands in every swizzle mode, TMA boxes with out-of-bounds fill, mbarrier phases and
// transaction counts, and (emulator only) deliberately broken protocols.
// tests/test_simt_hopper.py checks them against plain matmuls and the documented semantics.
#include "simt/simt_selftest_hopper.h"

#include "common/device_memory.h"
#include "common/errors.h"
#include "common/simt.h"
#include "common/simt_hopper.h"

namespace llmk {
namespace gpu {

namespace {

constexpr int kK = 64;  // K of the wgmma self-test: four k16 steps

struct WgmmaTest {
  simt::TensorMap a, b;  // A [64][kK] K-major; B [N][kK] K-major or [kK][N] MN-major
  const uint32_t* a_regs;  // [4 steps][128 threads][4]: A as register fragments (rs form)
  const float* c;          // [128][N / 2] fragment order
  float* d;
  int swizzle;
};


template <typename T, int N, int kTransB>
__global__ void __launch_bounds__(128) wgmma_kernel(const __grid_constant__ WgmmaTest p) {
#if defined(LLMK_SM90A) || !defined(__CUDACC__)  // Hopper-only: nothing to compile for other targets
  LLMK_DYNAMIC_SMEM(char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  char* sA = smem + 1024;
  char* sB = sA + 64 * kK * 2;
  // Box of 16-bit elements along the contiguous dim: one swizzle row, or one 16-byte core row.
  const int t = threadIdx.x, W = p.swizzle, be = W ? W / 2 : 8;
  // Operand regions: box j of a K-major tile holds its rows' elements [j * be, (j + 1) * be).
  const int a_region = 64 * be * 2;
  const int b_region = (kTransB ? kK : N) * be * 2;
  if (t == 0) {
    simt::mbar_init(bar, 1);
    simt::fence_barrier_init();
  }
  __syncthreads();
  if (t == 0) {
    const int na = kK / be, nb = (kTransB ? N : kK) / be;
    simt::mbar_arrive_expect_tx(bar, uint32_t(na * a_region + nb * b_region));
    for (int j = 0; j < na; ++j) simt::tma_load(sA + j * a_region, &p.a, bar, j * be, 0);
    for (int j = 0; j < nb; ++j) simt::tma_load(sB + j * b_region, &p.b, bar, j * be, 0);
  }
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = p.c[t * (N / 2) + i];
  simt::mbar_wait(bar, 0);
  simt::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const int e0 = kk * 16;
    // A, K-major: the box holding elements e0.., at their byte offset inside its rows.
    const int a_off = (e0 / be) * a_region + (e0 % be) * 2;
    const uint64_t da = simt::wgmma_desc(sA + a_off, W ? 16 : a_region, W ? 8 * W : 128, W);
    uint64_t db;
    if (kTransB) {  // B [kK][N], N contiguous: rows e0.. of every box; boxes along N at LBO
      db = W ? simt::wgmma_desc(sB + e0 * W, b_region, 8 * W, W) : simt::wgmma_desc(sB + e0 * 16, 128, b_region, 0);
    } else {
      const int b_off = (e0 / be) * b_region + (e0 % be) * 2;
      db = simt::wgmma_desc(sB + b_off, W ? 16 : b_region, W ? 8 * W : 128, W);
    }
    if (p.a_regs) {
      uint32_t a[4];
      for (int i = 0; i < 4; ++i) a[i] = p.a_regs[(kk * 128 + t) * 4 + i];
      simt::wgmma_rs<T, N, kTransB>(d, a, db, 1);
    } else {
      simt::wgmma_ss<T, N, kTransB>(d, da, db, 1);
    }
  }
  simt::wgmma_commit();
  simt::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < N / 2; ++i) p.d[t * (N / 2) + i] = d[i];
#endif
}

struct TmaTest {
  simt::TensorMap map;
  int c0, c1, c2, rank;
  uint4* out;
  int bytes;
};

__global__ void tma_kernel(const __grid_constant__ TmaTest p) {
#if defined(LLMK_SM90A) || !defined(__CUDACC__)  // Hopper-only: nothing to compile for other targets
  LLMK_DYNAMIC_SMEM(char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  char* dst = smem + 1024;
  if (threadIdx.x == 0) {
    simt::mbar_init(bar, 1);
    simt::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    simt::mbar_arrive_expect_tx(bar, uint32_t(p.bytes));
    if (p.rank == 2) simt::tma_load(dst, &p.map, bar, p.c0, p.c1);
    else simt::tma_load(dst, &p.map, bar, p.c0, p.c1, p.c2);
  }
  simt::mbar_wait(bar, 0);
  for (int i = threadIdx.x; i < p.bytes / 16; i += blockDim.x) p.out[i] = reinterpret_cast<const uint4*>(dst)[i];
#endif
}

// A producer (thread 0) and 64 consumers pass `rounds` values through a 2-slot ring guarded by
// full (count 1 + tx bytes) and empty (count 64) mbarriers, the values landing by TMA.
// out int32 [rounds][64]: what each consumer read; probe int32 [8]: try_wait results.
__global__ void mbar_kernel(const __grid_constant__ simt::TensorMap src, int rounds, int* out, int* probe) {
#if defined(LLMK_SM90A) || !defined(__CUDACC__)  // Hopper-only: nothing to compile for other targets
  LLMK_DYNAMIC_SMEM(char, smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + 2;
  uint64_t* extra = full + 4;
  char* ring = smem + 1024;  // 2 slots of 1024 bytes: [16][32] int16 each
  const int t = threadIdx.x;
  if (t == 0) {
    for (int s = 0; s < 2; ++s) {
      simt::mbar_init(&full[s], 1);
      simt::mbar_init(&empty[s], 64);
    }
    simt::mbar_init(extra, 2);
    simt::fence_barrier_init();
  }
  __syncthreads();
  if (t == 64) {  // phase bookkeeping of a barrier of count 2 with transactions
    probe[0] = simt::mbar_try_wait(extra, 0);  // nothing arrived: phase 0 open
    simt::mbar_arrive_expect_tx(extra, 1024);
    probe[1] = simt::mbar_try_wait(extra, 0);  // 1 of 2 arrivals, 1024 bytes due
    simt::mbar_arrive(extra);
    probe[2] = simt::mbar_try_wait(extra, 0);  // arrivals done, bytes still due
    simt::tma_load(ring + 2048, &src, extra, 0, 0);
    simt::mbar_wait(extra, 0);
    probe[3] = simt::mbar_try_wait(extra, 0);  // phase 0 complete
    probe[4] = simt::mbar_try_wait(extra, 1);  // phase 1 open
    simt::mbar_arrive(extra);
    simt::mbar_arrive(extra);
    probe[5] = simt::mbar_try_wait(extra, 1);  // phase 1 complete (no transactions)
    probe[6] = simt::mbar_try_wait(extra, 0);  // parity 0 again refers to the open phase 2
    probe[7] = reinterpret_cast<const int*>(ring + 2048)[3];
  }
  if (t == 0) {
    for (int r = 0; r < rounds; ++r) {
      const int s = r & 1;
      if (r >= 2) simt::mbar_wait(&empty[s], ((r >> 1) - 1) & 1);
      simt::mbar_arrive_expect_tx(&full[s], 1024);
      simt::tma_load(ring + s * 1024, &src, &full[s], 0, r * 16);
    }
  }
  if (t >= 1 && t <= 64) {
    const int c = t - 1;
    for (int r = 0; r < rounds; ++r) {
      const int s = r & 1;
      simt::mbar_wait(&full[s], (r >> 1) & 1);
      out[r * 64 + c] = reinterpret_cast<const int*>(ring + s * 1024)[c * 4];
      simt::mbar_arrive(&empty[s]);
    }
  }
#endif
}

#if !defined(__CUDACC__)
// Broken protocols: 0 wgmma result never waited for; 1 mbarrier wait with no arrival; 2 TMA load
// nobody waits for; 3 wgmma reached by half of a warpgroup; 4 accumulators read before the wait
// (no error: they read NaN, returned in sink[0]).
__global__ void hopper_fault_kernel(const __grid_constant__ simt::TensorMap map, int kind, float* sink) {
  LLMK_DYNAMIC_SMEM(char, smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  char* tile = smem + 1024;
  const int t = threadIdx.x;
  if (t == 0) simt::mbar_init(bar, 1);
  __syncthreads();
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  const uint64_t desc = simt::wgmma_desc(tile, 16, 1024, 128);
  switch (kind) {
    case 0:
      simt::wgmma_ss<__nv_bfloat16, 128, 0>(d, desc, desc, 1);
      simt::wgmma_commit();
      break;
    case 1:
      simt::mbar_wait(bar, 0);
      break;
    case 2:
      if (t == 0) simt::tma_load(tile, &map, bar, 0, 0);
      break;
    case 3:
      if (t < 64) {
        simt::wgmma_ss<__nv_bfloat16, 128, 0>(d, desc, desc, 1);
        simt::wgmma_commit();
        simt::wgmma_wait<0>();
      }
      break;
    default:
      simt::wgmma_ss<__nv_bfloat16, 128, 0>(d, desc, desc, 0);
      simt::wgmma_commit();
      sink[t] = d[0];  // too early
      simt::wgmma_wait<0>();
      break;
  }
}
#endif

simt::TensorMap map_of(const void* base, int rank, const uint64_t* dims, const uint64_t* strides,
                       const uint32_t* box, int swizzle) {
  simt::TensorMap m;
  LLMK_CHECK(simt::make_tensor_map(&m, base, 2, rank, dims, strides, box, swizzle), RuntimeError,
             "make_tensor_map: the tensor map was rejected (dims, strides, box or swizzle)");
  return m;
}

template <typename T, int N, int kTransB>
void launch_wgmma(WgmmaTest& p, int64_t stream) {
  constexpr int kSmem = 1024 + 64 * kK * 2 + N * kK * 2;
  auto kernel = &wgmma_kernel<T, N, kTransB>;
  simt::set_max_dynamic_smem(kernel, kSmem);
  LLMK_LAUNCH(kernel, 1, 128, kSmem, stream)(p);
}

}  // namespace

void selftest_wgmma(const TensorView& a, const TensorView& b, const TensorView& a_regs, const TensorView& c,
                    const TensorView& d, int n, bool trans_b, bool use_regs, int swizzle, bool fp16,
                    int64_t stream) {
  WgmmaTest p;
  const int be = swizzle ? swizzle / 2 : 8;
  const uint64_t a_dims[2] = {kK, 64}, a_str[1] = {kK * 2};
  const uint32_t a_box[2] = {uint32_t(be), 64};
  p.a = map_of(a.data, 2, a_dims, a_str, a_box, swizzle);
  // b is [N][kK] (K-major) or [kK][N] (MN-major), contiguous.
  const uint64_t inner = trans_b ? uint64_t(n) : uint64_t(kK), outer = trans_b ? uint64_t(kK) : uint64_t(n);
  const uint64_t b_dims[2] = {inner, outer}, b_str[1] = {inner * 2};
  const uint32_t b_box[2] = {uint32_t(be), uint32_t(outer)};
  p.b = map_of(b.data, 2, b_dims, b_str, b_box, swizzle);
  p.a_regs = use_regs ? a_regs.ptr<const uint32_t>() : nullptr;
  p.c = c.ptr<const float>();
  p.d = d.ptr<float>();
  p.swizzle = swizzle;
#define LLMK_WGMMA_CASE(T)                                                             \
  if (n == 64) trans_b ? launch_wgmma<T, 64, 1>(p, stream) : launch_wgmma<T, 64, 0>(p, stream); \
  else trans_b ? launch_wgmma<T, 128, 1>(p, stream) : launch_wgmma<T, 128, 0>(p, stream);
  if (fp16) {
    LLMK_WGMMA_CASE(__half)
  } else {
    LLMK_WGMMA_CASE(__nv_bfloat16)
  }
#undef LLMK_WGMMA_CASE
  check_launch("selftest_wgmma");
}

void selftest_tma(const TensorView& src, const int* coords, const int* box, int swizzle, const TensorView& out,
                  int64_t stream) {
  TmaTest p;
  p.rank = int(src.ndim);
  uint64_t dims[3] = {}, strides[2] = {};
  uint32_t bx[3] = {};
  for (int i = 0; i < p.rank; ++i) {
    dims[i] = uint64_t(src.size(p.rank - 1 - i));
    bx[i] = uint32_t(box[i]);
    if (i > 0) strides[i - 1] = uint64_t(src.stride(p.rank - 1 - i)) * 2;
  }
  p.map = map_of(src.data, p.rank, dims, strides, bx, swizzle);
  p.c0 = coords[0];
  p.c1 = coords[1];
  p.c2 = p.rank == 3 ? coords[2] : 0;
  p.out = out.ptr<uint4>();
  p.bytes = int(out.numel() * 2);
  const int smem = 1024 + p.bytes;
  simt::set_max_dynamic_smem(tma_kernel, smem);
  LLMK_LAUNCH(tma_kernel, 1, 128, smem, stream)(p);
  check_launch("selftest_tma");
}

void selftest_mbarrier(const TensorView& src, int rounds, const TensorView& out, const TensorView& probe,
                       int64_t stream) {
  const uint64_t dims[2] = {32, uint64_t(src.size(0))}, strides[1] = {64};
  const uint32_t box[2] = {32, 16};
  const simt::TensorMap m = map_of(src.data, 2, dims, strides, box, 0);
  LLMK_LAUNCH(mbar_kernel, 1, 128, 4096, stream)(m, rounds, out.ptr<int>(), probe.ptr<int>());
  check_launch("selftest_mbarrier");
}

#if !defined(__CUDACC__)
void selftest_hopper_fault(int kind, int64_t stream) {
  __align__(16) static uint16_t src[64 * 64] = {};
  const uint64_t dims[2] = {64, 64}, strides[1] = {128};
  const uint32_t box[2] = {64, 64};
  const simt::TensorMap m = map_of(src, 2, dims, strides, box, 128);
  float sink[128] = {};
  LLMK_LAUNCH(hopper_fault_kernel, 1, 128, 1024 + 64 * 128 * 2, stream)(m, kind, sink);
  check_launch("selftest_hopper_fault");
  LLMK_CHECK(!(kind == 4 && sink[0] == sink[0]), RuntimeError,
             "selftest_hopper_fault: accumulators read before wgmma_wait were not NaN");
}
#endif

}  // namespace gpu
}  // namespace llmk
