// Attention over a quantised KV cache (kv_cache_dtype fp8 e4m3 / e5m2 or int8) on CUDA cores,
// every shape (decode, append, paged prefill): K/V codes are read from the cache and
// dequantised in registers (value = code * scale of the kv head); no dequantised copy exists.
//
// One CTA per (sequence, query head, query row; rows beyond grid z loop), kThreads threads. Keys
// go in tiles of kThreads, one key per thread for q.k; the tile's probabilities pass through
// shared memory and each thread accumulates output features d = tid, tid + kThreads for P.V.
// Simple and exact in fp32 rather than tensor-core fast: quantised caches serve the memory-bound
// decode, where the bytes read, which this halves or quarters, are what costs.
#include <type_traits>

#include "attention/attention_math.h"
#include "attention/flash_launch.h"
#include "common/elem_device.cuh"
#include "common/kv_quant.h"

namespace llmk {
namespace gpu {
namespace attn {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxD = 256;
constexpr int kOut = kMaxD / kThreads;  // output features per thread

LLMK_DEVICE float block_reduce(float v, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();  // red is reused by the next reduction
  return r;
}

template <typename T>
__global__ void quant_kv_attn_kernel(const AttnParams p) {
  __shared__ float sq_row[kMaxD];
  __shared__ float sp[kThreads];
  __shared__ float red[kThreads / 32];
  const int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int kvh = h / (p.num_heads / p.num_kv_heads), D = p.head_dim;
  const int sq = attn_seqlen_q(p, b), sk = attn_seqlen_k(p, b);
  const uint8_t* kc = static_cast<const uint8_t*>(p.k);
  const uint8_t* vc = static_cast<const uint8_t*>(p.v);
  const float ks = kvq::head_scale(p.k_scale, p.k_scale_stride, kvh);
  const float vs = kvq::head_scale(p.v_scale, p.v_scale_stride, kvh);
  const float slope = p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
  for (int i = blockIdx.z; i < sq; i += gridDim.z) {
    const int64_t row = attn_q_start(p, b) + i;
    const T* q = static_cast<const T*>(p.q) + row * p.q_row_stride + int64_t(h) * p.q_head_stride;
    for (int d = tid; d < D; d += kThreads) sq_row[d] = ld(q[d]) * p.softmax_scale;
    __syncthreads();
    KeyRange kr = attn_key_range(i, sq, sk, p.window_left, p.window_right);
    if (kr.lo < 0) kr.lo = 0;
    if (kr.hi > sk) kr.hi = sk;
    SoftmaxState sm{-INFINITY, 0.f};
    float o[kOut];
    for (int e = 0; e < kOut; ++e) o[e] = 0.f;
    for (int j0 = kr.lo; j0 < kr.hi; j0 += kThreads) {
      const int j = j0 + tid;
      float s = -INFINITY;
      if (j < kr.hi) {
        const uint8_t* k = kc + attn_kv_offset(p, false, b, j, kvh);
        float acc = 0.f;
        for (int d = 0; d < D; ++d) acc += sq_row[d] * kvq::decode(k[d], p.kv_quant);
        s = attn_softcap(acc * ks, p.softcap);
        if (p.alibi_slopes) s += attn_alibi(slope, i, j, sq, sk);
      }
      const float alpha = attn_softmax_rescale(sm, block_reduce(s, red, true));
      const float pj = expf(s - attn_exp_base(sm.m));
      sp[tid] = pj;
      sm.l += block_reduce(pj, red, false);  // the reduction's barrier also publishes sp
      const int n = kr.hi - j0 < kThreads ? kr.hi - j0 : kThreads;
      for (int e = 0; e < kOut; ++e) {
        const int d = tid + e * kThreads;
        float acc = o[e] * alpha;
        if (d < D)
          for (int jj = 0; jj < n; ++jj)
            acc += sp[jj] * kvq::decode(vc[attn_kv_offset(p, true, b, j0 + jj, kvh) + d], p.kv_quant) * vs;
        o[e] = acc;
      }
      __syncthreads();  // sp is rewritten by the next tile
    }
    const float inv = sm.l > 0.f ? 1.f / sm.l : 0.f;
    T* out = static_cast<T*>(p.out) + row * p.o_row_stride + int64_t(h) * p.o_head_stride;
    for (int e = 0; e < kOut; ++e) {
      const int d = tid + e * kThreads;
      if (d < D) out[d] = st<T>(o[e] * inv);
    }
    if (p.lse && tid == 0) p.lse[attn_lse_offset(p, b, h, i)] = attn_lse(sm);
    __syncthreads();  // sq_row is rewritten for the next row
  }
}

}  // namespace

void launch_quant_kv(const AttnParams& p, int64_t stream) {
  const int rows = p.cu_seqlens_q ? p.max_seqlen_q : p.seqlen_q;
  const dim3 grid(unsigned(p.batch), unsigned(p.num_heads),
                  unsigned(rows < kMaxGridYZ ? (rows > 0 ? rows : 1) : kMaxGridYZ));
  by_dtype(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto kernel = &quant_kv_attn_kernel<T>;
    LLMK_LAUNCH(kernel, grid, kThreads, 0, stream)(p);
  });
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
