// Self-test kernels of the Hopper layer (simt_selftest_hopper.cu), in llmkern._simt (emulated)
// and, in builds for sm_90a, in llmkern._C. Arguments are validated by the bindings
// (selftest_hopper_bindings.cpp); tests/test_simt_hopper.py holds the expectations.
#pragma once
#include <cstdint>

#include "common/tensor.h"

namespace pybind11 {
class module_;
}

namespace llmk {

void bind_simt_selftest_hopper(pybind11::module_& m);

namespace gpu {

// a int16 [64, 64] (M x K), b int16 [n, 64] (trans_b false: K-major) or [64, n] (trans_b true),
// a_regs int32 [4, 128, 4] (A as the k16 steps' register fragments; used when use_regs),
// c, d float [128, n / 2] (accumulator fragments, thread-major): d = c + a @ b through TMA loads
// with `swizzle` (0, 32, 64, 128) and four chained wgmma m64nNk16 (n 64 or 128).
void selftest_wgmma(const TensorView& a, const TensorView& b, const TensorView& a_regs, const TensorView& c,
                    const TensorView& d, int n, bool trans_b, bool use_regs, int swizzle, bool fp16,
                    int64_t stream);
// src int16 [d1, d0] or [d2, d1, d0]; coords / box innermost first; out int16 [box elements]:
// the box as it lands in shared memory (swizzled, out-of-bounds elements zero).
void selftest_tma(const TensorView& src, const int* coords, const int* box, int swizzle, const TensorView& out,
                  int64_t stream);
// src int16 [16 * rounds, 32]; out int32 [rounds, 64]; probe int32 [8] (see the kernel).
void selftest_mbarrier(const TensorView& src, int rounds, const TensorView& out, const TensorView& probe,
                       int64_t stream);
// Emulator only: kind 0-4, broken protocols the emulator must report (see the kernel).
void selftest_hopper_fault(int kind, int64_t stream);

}  // namespace gpu
}  // namespace llmk
