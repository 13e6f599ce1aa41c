// CUDA rotary embedding: one thread block per token; its threads take the (head, pair) items of
// the query heads, then of the key heads, reading the token's cos/sin row from L1/L2.
#include <cstdint>
#include <type_traits>

#include "common/elem_device.cuh"
#include "common/simt.h"
#include "rotary/rotary.h"
#include "rotary/rotary_math.h"

namespace llmk {
namespace gpu {

namespace {

constexpr int kThreads = 128;

template <typename T, typename P, bool Neox>
__global__ void rotary_kernel(const P* positions, T* q, int64_t q_stride, int64_t q_hstride, int qh, T* k,
                              int64_t k_stride, int64_t k_hstride, int kh, const T* cache, int64_t cache_stride,
                              int half) {
  const int64_t t = blockIdx.x;
  const T* cs = cache + static_cast<int64_t>(positions[t]) * cache_stride;
  const int items = (qh + kh) * half;
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    const int h = it / half, i = it % half;
    T* x = h < qh ? q + t * q_stride + static_cast<int64_t>(h) * q_hstride
                  : k + t * k_stride + static_cast<int64_t>(h - qh) * k_hstride;
    int a, b;
    rope_pair(i, 2 * half, Neox, a, b);
    float u = ld(x[a]), v = ld(x[b]);
    rope_rotate(u, v, ld(cs[i]), ld(cs[half + i]));
    x[a] = st<T>(u);
    x[b] = st<T>(v);
  }
}

}  // namespace

void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView* key, int head_size,
                      const TensorView& cos_sin_cache, bool is_neox, int64_t stream) {
  by_dtype(query.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto go = [&](auto* ptag, auto neox) {
      using P = std::remove_pointer_t<decltype(ptag)>;
      LLMK_LAUNCH((rotary_kernel<T, P, decltype(neox)::value>), static_cast<unsigned>(positions.numel()), kThreads, 0,
                  stream)(positions.ptr<const P>(), query.ptr<T>(), query.stride(0),
                          rotary_head_stride(query, head_size), rotary_heads(query, head_size),
                          key ? key->ptr<T>() : nullptr, key ? key->stride(0) : 0,
                          key ? rotary_head_stride(*key, head_size) : 0, key ? rotary_heads(*key, head_size) : 0,
                          cos_sin_cache.ptr<const T>(), cos_sin_cache.stride(0),
                          static_cast<int>(cos_sin_cache.size(1) / 2));
    };
    auto by_pos = [&](auto neox) {
      if (positions.dtype == DType::I64) go(static_cast<int64_t*>(nullptr), neox);
      else go(static_cast<int32_t*>(nullptr), neox);
    };
    if (is_neox) by_pos(std::true_type{});
    else by_pos(std::false_type{});
  });
}

}  // namespace gpu
}  // namespace llmk
