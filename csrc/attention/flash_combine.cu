// Split-KV combine: merges the partial results of the splits of each (query row, head) with
// their log-sum-exp weights into the output (and the final LSE).
#include "attention/flash_launch.h"

namespace llmk {
namespace gpu {
namespace attn {

constexpr int kCombineWarps = 4;

// One warp per (query row, head): lane 0 weighs the splits, then the lanes walk head_dim 4 floats
// at a time.
template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) flash_combine_kernel(const KernelArgs a) {
  __shared__ float s_w[kCombineWarps][kMaxSplits];
  const AttnParams& p = a.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = a.batch0 + int(blockIdx.y);
  const SeqInfo s = seq_info(p, b);
  const int pair = int(blockIdx.x) * kCombineWarps + warp;
  const int i = pair / p.num_heads, h = pair % p.num_heads;
  if (i >= s.seqlen_q) return;  // whole warp: no block-wide barrier below
  const int64_t rows = total_q_rows(p);
  const int64_t row = s.q_row0 + i;
  const int ns = a.num_splits;
  // Weights exp(lse_s - lse) of the splits (attn_combine_weights: shared with the CPU combine).
  __shared__ float s_lse[kCombineWarps];
  if (lane == 0)
    s_lse[warp] = attn_combine_weights(split_lse_at(p, rows, 0, row, h), rows * p.num_heads, ns,
                                       s_w[warp]);
  __syncwarp(0xffffffffu);
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
    out[d] = Elem<T>::from_float(acc.x);
    out[d + 1] = Elem<T>::from_float(acc.y);
    out[d + 2] = Elem<T>::from_float(acc.z);
    out[d + 3] = Elem<T>::from_float(acc.w);
  }
  if (lane == 0 && p.lse) *lse_at(p, b, h, i) = s_lse[warp];
}

template <typename T>
void launch_combine(const KernelArgs& args, int64_t stream) {
  KernelArgs a = args;
  const AttnParams& p = a.p;
  const int64_t pairs = int64_t(p.max_seqlen_q) * p.num_heads;
  auto flash_combine = &flash_combine_kernel<T>;
  for_each_grid_chunk(p.batch, [&](int64_t first, unsigned count) {
    a.batch0 = int(first);
    const dim3 grid(unsigned((pairs + kCombineWarps - 1) / kCombineWarps), count);
    LLMK_LAUNCH(flash_combine, grid, kCombineWarps * 32, 0, stream)(a);
  });
}

template void launch_combine<float>(const KernelArgs& a, int64_t stream);
template void launch_combine<__half>(const KernelArgs& a, int64_t stream);
template void launch_combine<__nv_bfloat16>(const KernelArgs& a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
