// Host-side helpers of the sampling CUDA launchers: per-row parameters as the kernels read them and
// the CTA size of a row kernel.
#pragma once
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"

namespace llmk {
namespace gpu {
namespace samp {

inline DParam dparam(const RowParam& r) {
  DParam d{nullptr, 0, 0, r.val, static_cast<unsigned long long>(r.uval)};
  if (r.arr) {
    const TensorView& t = *r.arr;
    d.p = t.data;
    d.dt = t.dtype == DType::F32 ? 1 : t.dtype == DType::F64 ? 2 : t.dtype == DType::I32 ? 3 : 4;
    d.one = t.numel() == 1;
  }
  return d;
}

// Threads of a row CTA: about eight 16-byte vectors per thread per pass, a multiple of 32 in
// [32, kMaxThreads] (long rows use the full CTA; short ones do not pay for idle warps).
inline int row_threads(int64_t V, int elem_size) {
  const int64_t n = 16 / elem_size;
  const int64_t nvec = (V + n - 1) / n;
  int64_t t = ((nvec + 7) / 8 + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > kMaxThreads) t = kMaxThreads;
  return static_cast<int>(t);
}

}  // namespace samp
}  // namespace gpu
}  // namespace llmk
