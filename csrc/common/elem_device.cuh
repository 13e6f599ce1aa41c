// Element access of the CUDA kernels that take float / half / bfloat16 rows (the device twin of the
// element types of common/vec_cpu.h): load to fp32, store from fp32 (round to nearest even), and
// the dtype dispatch.
#pragma once
#include "common/simt.h"
#include "common/tensor.h"

namespace llmk {
namespace gpu {

LLMK_DEVICE float ld(float v) { return v; }
LLMK_DEVICE float ld(__half v) { return __half2float(v); }
LLMK_DEVICE float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> LLMK_DEVICE T st(float v);
template <> LLMK_DEVICE float st<float>(float v) { return v; }
template <> LLMK_DEVICE __half st<__half>(float v) { return __float2half_rn(v); }
template <> LLMK_DEVICE __nv_bfloat16 st<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// f(tag) with tag a null pointer to the device element type of a float tensor's dtype.
template <typename F>
inline void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(static_cast<float*>(nullptr)); break;
    case DType::BF16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
    default: f(static_cast<__half*>(nullptr)); break;
  }
}

}  // namespace gpu
}  // namespace llmk
