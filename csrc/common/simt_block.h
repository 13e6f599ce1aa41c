// Block-wide reductions and scans built on the SIMT layer (no CUB): warp shuffles, then one
// value per warp through a __shared__ scratch of 32 elements. For any block whose size is a
// multiple of 32, up to 1024. Every thread gets the result; every warp combines the per-warp
// values in the same order, so results are identical across threads and deterministic.
// Each call has two __syncthreads: the first guards the scratch against readers of the previous
// call, so calls may follow each other with the same scratch.
//
//   float block_reduce_sum(float v, float* scratch);    int block_reduce_sum(int v, int* scratch);
//   float block_reduce_max(float v, float* scratch);    float block_reduce_min(float v, float* scratch);
//   T block_inclusive_scan(T v, T* scratch[, T* total]);  T block_exclusive_scan(T v, T* scratch[, T* total])
//   T warp_reduce_sum(T v), warp_reduce_max(T v), warp_inclusive_scan(T v)   (full warp)
#pragma once
#include "common/simt.h"

namespace llmk {
namespace simt {

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v) { return warp_allreduce(v, SumOp()); }
template <typename T>
__device__ __forceinline__ T warp_reduce_max(T v) { return warp_allreduce(v, MaxOp()); }

template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = lane_id();
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

__device__ __forceinline__ int block_threads() {
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
#if !defined(__CUDACC__)
  if (n % 32) emu::fail("block reductions/scans need a block size that is a multiple of 32");
#endif
  return n;
}

template <typename T, typename Op>
__device__ __forceinline__ T block_allreduce(T v, T* scratch, Op op, T identity) {
  const int lane = lane_id(), warp = warp_id(), nwarps = block_threads() >> 5;
  v = warp_allreduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_allreduce(lane < nwarps ? scratch[lane] : identity, op);
}

__device__ __forceinline__ float block_reduce_sum(float v, float* scratch) {
  return block_allreduce(v, scratch, SumOp(), 0.0f);
}
__device__ __forceinline__ int block_reduce_sum(int v, int* scratch) {
  return block_allreduce(v, scratch, SumOp(), 0);
}
__device__ __forceinline__ float block_reduce_max(float v, float* scratch) {
  return block_allreduce(v, scratch, MaxOp(), -INFINITY);
}
__device__ __forceinline__ float block_reduce_min(float v, float* scratch) {
  return block_allreduce(v, scratch, MinOp(), INFINITY);
}

// Scans in thread order (linear thread index). `total` (optional) receives the block's sum.
template <typename T>
__device__ __forceinline__ T block_scan(T v, T* scratch, bool inclusive, T* total) {
  const int lane = lane_id(), warp = warp_id(), nwarps = block_threads() >> 5;
  const T incl = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  const T warps_incl = warp_inclusive_scan(lane < nwarps ? scratch[lane] : T(0));
  const T before = __shfl_sync(0xffffffffu, warps_incl, warp == 0 ? 0 : warp - 1);
  if (total) *total = __shfl_sync(0xffffffffu, warps_incl, nwarps - 1);
  const T excl_in_warp = __shfl_up_sync(0xffffffffu, incl, 1);
  const T prefix = warp == 0 ? T(0) : before;
  if (inclusive) return prefix + incl;
  return lane == 0 ? prefix : prefix + excl_in_warp;
}

template <typename T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* scratch, T* total = nullptr) {
  return block_scan(v, scratch, true, total);
}
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* scratch, T* total = nullptr) {
  return block_scan(v, scratch, false, total);
}

}  // namespace simt

// Kernels in llmk::gpu may call these unqualified.
using simt::block_exclusive_scan;
using simt::block_inclusive_scan;
using simt::block_reduce_max;
using simt::block_reduce_min;
using simt::block_reduce_sum;
using simt::warp_inclusive_scan;
using simt::warp_reduce_max;
using simt::warp_reduce_sum;

}  // namespace llmk
