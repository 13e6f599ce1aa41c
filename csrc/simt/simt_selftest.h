// Self-test kernels of the SIMT layer (simt_selftest.cu): compiled into llmkern._simt (emulated)
// and, when CUDA is compiled, into llmkern._C (real GPU), so tests/test_simt_layer.py checks both
// against the same expectations. Arguments are validated by the bindings (selftest_bindings.cpp).
#pragma once
#include <cstdint>

#include "common/tensor.h"

namespace pybind11 {
class module_;
}

namespace llmk {

void bind_simt_selftest(pybind11::module_& m);

namespace gpu {

// in int32 [n]; ops int32 [k, 3] = (op, operand, width); out int32 [k, n]; one block of n threads.
// op: 0 shfl idx, 1 up, 2 down, 3 xor, 4 ballot(bit `operand` of v), 5 any, 6 all (same predicate),
//     7 xor-1 shuffle by the lanes of mask `operand` only (others write -1),
//     8 ballot(bit 0 of v) by the lanes of mask `operand` only, 9 __activemask()
void selftest_warp(const TensorView& in, const TensorView& ops, const TensorView& out, int64_t stream);
// out int32 [blocks, threads, 10]: per thread tid.xyz, block linear index, lane, warp, counter
// after phase 1 and 2, __syncthreads_count(t % 3 == 0), __syncthreads_or(t == last) +
// 2 * __syncthreads_and(t >= 0)
void selftest_barrier(const TensorView& out, int bx, int by, int bz, int gx, int gy, int64_t stream);
// x float [rows, n] -> out float [rows, n, 5]: sum, max, inclusive, exclusive, total;
// xi int32 [rows, n] -> outi int32 [rows, n, 2]: sum, inclusive scan. One block of n per row.
void selftest_block(const TensorView& x, const TensorView& out, const TensorView& xi,
                    const TensorView& outi, int64_t stream);
// icount int32 [8], ucount int32 [2] (as unsigned), ull int64 [1], fsum float32 [1].
void selftest_atomics(const TensorView& icount, const TensorView& ucount, const TensorView& ull,
                      const TensorView& fsum, int blocks, int threads, int64_t stream);
// out int32 [n + 1]: reversed through dynamic smem of `smem_bytes`; out[n] = alignment flag.
void selftest_dynamic_smem(const TensorView& out, int64_t smem_bytes, bool opt_in, int64_t stream);
// src int32 [rows, 4], src_bytes int32 [rows], out int32 [2, rows, 4]; one block of `rows` threads
void selftest_cp_async(const TensorView& src, const TensorView& src_bytes, const TensorView& out,
                       int64_t stream);
// rows int16 [32, 8] (shared-memory rows), perm int32 [32] (row lane l points at),
// out int32 [6, 32, 4]: x1, x2, x4, x1.trans, x2.trans, x4.trans
void selftest_ldmatrix(const TensorView& rows, const TensorView& perm, const TensorView& out,
                       int64_t stream);
// Fragments as documented: a int32 [32, 4], b int32 [32, 2], c float [32, 4] -> d float [32, 4].
void selftest_mma(const TensorView& a, const TensorView& b, const TensorView& c, const TensorView& d,
                  bool fp16, int64_t stream);
// a int16 [16, 16] (row-major M x K), b int16 [16, 8] (row-major K x N) -> out float [16, 8] =
// a @ b through shared memory, ldmatrix_x4 / ldmatrix_x2_trans and one mma.
void selftest_ldmatrix_mma(const TensorView& a, const TensorView& b, const TensorView& out,
                           bool fp16, int64_t stream);
// x float [n] -> half int16 [n], bf16 int16 [n], back float [2, n], pairs int32 [2, n / 2]
// (__floats2half2_rn / __floats2bfloat162_rn of x[2i], x[2i+1]), math float [8, n]: __expf(min(x, 10)),
// exp2f(clamp(x, -10, 10)), __logf(a), rsqrtf(a), __fdividef(x, a), tanhf(x), __fmaf_rn(x, a, 1),
// -x + sqrtf(a) through the bit casts, with a = |x| + 0.5.
void selftest_convert(const TensorView& x, const TensorView& half, const TensorView& bf16,
                      const TensorView& back, const TensorView& pairs, const TensorView& math,
                      int64_t stream);
// Deliberately broken kernels (emulator only: on a GPU they hang or are undefined).
void selftest_fault(int kind, int64_t stream);
// `iters` rounds of __syncthreads + a warp shuffle in one block of `threads` (emulator speed).
void selftest_spin(int iters, int threads, int64_t stream);

}  // namespace gpu
}  // namespace llmk
