// CUDA kernel of apply_token_bitmask_inplace: one thread per logit (grid.y walks the rows); a warp
// covers 32 consecutive tokens, so its threads read the same mask word.
#include "common/device_memory.h"
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"

namespace llmk {
namespace gpu {

namespace {

using namespace samp;

constexpr int kMaskThreads = 256;

struct BitmaskK {
  void* logits;
  int64_t ls;  // row stride (elements)
  const int32_t* bitmask;
  int64_t bs;
  const void* indices;
  int idx64;
  int64_t nrows, vocab;
};

template <typename T>
__global__ void __launch_bounds__(kMaskThreads) apply_bitmask_kernel(BitmaskK a) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.vocab) return;
  for (int64_t k = blockIdx.y; k < a.nrows; k += gridDim.y) {
    const int64_t row = a.indices ? read_index(a.indices, a.idx64 != 0, k) : k;
    if (!token_allowed(a.bitmask + row * a.bs, j)) from_f(-INFINITY, static_cast<T*>(a.logits) + row * a.ls + j);
  }
}

}  // namespace

void apply_bitmask(const BitmaskArgs& a) {
  BitmaskK k{a.logits.data, a.logits.stride(0), a.bitmask.ptr<const int32_t>(), a.bitmask.stride(0),
             a.indices ? a.indices->data : nullptr, a.indices && a.indices->dtype == DType::I64, a.nrows, a.vocab};
  const dim3 grid(static_cast<unsigned>((a.vocab + kMaskThreads - 1) / kMaskThreads),
                  static_cast<unsigned>(a.nrows < 65535 ? a.nrows : 65535));
  switch (a.logits.dtype) {
    case DType::F32: LLMK_LAUNCH(apply_bitmask_kernel<float>, grid, kMaskThreads, 0, a.stream)(k); break;
    case DType::F16: LLMK_LAUNCH(apply_bitmask_kernel<__half>, grid, kMaskThreads, 0, a.stream)(k); break;
    default: LLMK_LAUNCH(apply_bitmask_kernel<__nv_bfloat16>, grid, kMaskThreads, 0, a.stream)(k); break;
  }
  check_launch("apply_token_bitmask_inplace");
}

}  // namespace gpu
}  // namespace llmk
