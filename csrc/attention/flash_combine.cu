// Split-KV combine: merges the partial results of the splits of each (query row, head) with
// their log-sum-exp weights into the output (and the final LSE).
#include "attention/flash_launch.h"

namespace llmk {
namespace gpu {
namespace attn {

constexpr int kCombineWarps = 4;

// One warp per (query row, head): lanes weigh the splits, then walk head_dim 4 floats at a time.
template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) flash_combine_kernel(const KernelArgs a) {
  __shared__ float s_w[kCombineWarps][kMaxSplits];
  const AttnParams& p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.y;
  const SeqInfo s = seq_info(p, b);
  const int pair = int(blockIdx.x) * kCombineWarps + warp;
  const int i = pair / p.num_heads, h = pair % p.num_heads;
  if (i >= s.seqlen_q) return;  // whole warp: no block-wide barrier below
  const int64_t rows = total_q_rows(p);
  const int64_t row = s.q_row0 + i;
  const int ns = a.num_splits;
  float mx = -INFINITY;
  for (int sp = lane; sp < ns; sp += 32) mx = fmaxf(mx, *split_lse_at(p, rows, sp, row, h));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  for (int sp = lane; sp < ns; sp += 32) {
    const float l = *split_lse_at(p, rows, sp, row, h);
    const float w = l == -INFINITY ? 0.f : expf(l - mx);
    s_w[warp][sp] = w;
    sum += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __syncwarp(0xffffffffu);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  T* out = static_cast<T*>(p.out) + row * p.o_row_stride + int64_t(h) * p.o_head_stride;
  for (int d = lane * 4; d < p.head_dim; d += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < ns; ++sp) {
      const float w = s_w[warp][sp];
      if (w == 0.f) continue;
      const float4 v = *reinterpret_cast<const float4*>(split_out_row(p, rows, sp, row, h) + d);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    out[d] = Elem<T>::from_float(acc.x * inv);
    out[d + 1] = Elem<T>::from_float(acc.y * inv);
    out[d + 2] = Elem<T>::from_float(acc.z * inv);
    out[d + 3] = Elem<T>::from_float(acc.w * inv);
  }
  if (lane == 0 && p.lse) *lse_at(p, b, h, s.q_row0, i) = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

template <typename T>
void launch_combine(const KernelArgs& a, int64_t stream) {
  const AttnParams& p = a.p;
  const int64_t pairs = int64_t(p.max_seqlen_q) * p.num_heads;
  const dim3 grid(unsigned((pairs + kCombineWarps - 1) / kCombineWarps), unsigned(p.batch));
  auto kern = &flash_combine_kernel<T>;
  LLMK_LAUNCH(kern, grid, kCombineWarps * 32, 0, stream)(a);
}

template void launch_combine<float>(const KernelArgs& a, int64_t stream);
template void launch_combine<__half>(const KernelArgs& a, int64_t stream);
template void launch_combine<__nv_bfloat16>(const KernelArgs& a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
