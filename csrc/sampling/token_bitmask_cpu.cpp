// CPU kernel of apply_token_bitmask_inplace: rows are cut into 2048-token chunks run in parallel;
// a chunk walks its mask words and writes -inf at the clear bits only (a word of set bits costs a
// compare).
#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

template <DType DT, typename T = elem_t<DT>>
void mask_chunk(T* x, const int32_t* mask, int64_t lo, int64_t hi) {
  const T neg = vec::from_f32<DT>(-kInf);
  for (int64_t j0 = lo; j0 < hi; j0 += 32) {
    const uint32_t bits = static_cast<uint32_t>(mask[j0 >> 5]);
    if (bits == 0xffffffffu) continue;
    const int64_t e = std::min(hi, j0 + 32);
    for (int64_t j = j0; j < e; ++j)
      if (!((bits >> (j - j0)) & 1u)) x[j] = neg;
  }
}

}  // namespace

void apply_bitmask(const BitmaskArgs& a) {
  const int64_t nchunks = (a.vocab + kBlock - 1) / kBlock;
  dispatch_elem(a.logits.dtype, [&](auto tag) {
    constexpr DType DT = decltype(tag)::value;
    using T = elem_t<DT>;
    parallel_for(a.nrows * nchunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t k = t / nchunks, c = t % nchunks;
        const int64_t row = a.indices ? index_of(*a.indices, k) : k;
        T* x = a.logits.ptr<T>() + row * a.logits.stride(0);
        const int32_t* mask = a.bitmask.ptr<const int32_t>() + row * a.bitmask.stride(0);
        mask_chunk<DT>(x, mask, c * kBlock, std::min(a.vocab, (c + 1) * kBlock));
      }
    });
  });
}

LLMK_NS_END
