// CPU rotary embedding: threads split the tokens; each token's cos/sin row is read once for all
// of its query and key heads.
#include "common/checks.h"
#include "common/vec_cpu.h"
#include "common/parallel.h"
#include "rotary/rotary.h"
#include "rotary/rotary_head_cpu.h"

LLMK_NS_BEGIN

namespace {

template <DType DT, bool Neox, typename T = vec::elem_t<DT>>
void rotate_heads(T* row, int heads, int64_t head_stride, const T* cos, const T* sin, int half) {
  for (int h = 0; h < heads; ++h) rotate_head<DT, Neox>(row + int64_t(h) * head_stride, cos, sin, half);
}

template <DType DT, bool Neox, typename T = vec::elem_t<DT>>
void run(const TensorView& positions, const TensorView& query, const TensorView* key, int head_size,
         const TensorView& cache) {
  const int64_t T_ = positions.numel();
  const int half = int(cache.size(1) / 2);
  const int qh = ::llmk::rotary_heads(query, head_size), kh = key ? ::llmk::rotary_heads(*key, head_size) : 0;
  const int64_t qhs = ::llmk::rotary_head_stride(query, head_size);
  const int64_t khs = key ? ::llmk::rotary_head_stride(*key, head_size) : 0;
  const T* cs = cache.ptr<const T>();
  T* q = query.ptr<T>();
  T* k = key ? key->ptr<T>() : nullptr;
  // >= 16 tokens per task: a token is only a few hundred multiply-adds.
  parallel_for(T_, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* c = cs + ::llmk::index_at(positions, t) * cache.stride(0);
      rotate_heads<DT, Neox>(q + t * query.stride(0), qh, qhs, c, c + half, half);
      if (k) rotate_heads<DT, Neox>(k + t * key->stride(0), kh, khs, c, c + half, half);
    }
  });
}

}  // namespace

void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView* key, int head_size,
                      const TensorView& cos_sin_cache, bool is_neox, int64_t /*stream*/) {
  vec::dispatch_elem(query.dtype, [&](auto tag) {
    constexpr DType DT = decltype(tag)::value;
    if (is_neox) run<DT, true>(positions, query, key, head_size, cos_sin_cache);
    else run<DT, false>(positions, query, key, head_size, cos_sin_cache);
  });
}

LLMK_NS_END
