// Python entry points of the SIMT layer's self-test kernels (simt_selftest.cu): in llmkern._simt
// (emulated, host tensors) and, when CUDA is compiled, in llmkern._C (GPU tensors).
#include "common/bindings.h"
#include "common/checks.h"
#include "simt/simt_selftest.h"
#include "simt/simt_selftest_hopper.h"

#if defined(LLMK_SIMT)
#include "simt/simt_runtime.h"
#endif

namespace llmk {

#if defined(LLMK_SIMT) || defined(LLMK_WITH_CUDA)
namespace {

void need(const TensorView& t, const char* name, DType dtype, int64_t numel) {
  check_dtype(t, name, dtype);
  check_contiguous(t, name);
  LLMK_CHECK(t.numel() == numel, ValueError, name, ": expected ", numel, " elements, got ", t.numel());
#if defined(LLMK_SIMT)
  LLMK_CHECK(t.is_cpu(), ValueError, name, ": the emulator runs on host tensors, got ", device_str(t));
#else
  LLMK_CHECK(t.is_cuda(), ValueError, name, ": expected a CUDA tensor, got ", device_str(t));
#endif
}

int64_t rows_of(const TensorView& t, const char* name) {
  LLMK_CHECK(t.ndim >= 1, ValueError, name, ": expected at least 1 dim");
  return t.size(0);
}

}  // namespace

void bind_simt_selftest(pybind11::module_& m) {
  bind_simt_selftest_hopper(m);
  m.def("simt_selftest_warp", [](TensorView in, TensorView ops, TensorView out, int64_t stream) {
    const int64_t n = rows_of(in, "in"), k = rows_of(ops, "ops");
    LLMK_CHECK(n >= 1 && n <= 1024, ValueError, "in: 1 to 1024 threads, got ", n);
    need(in, "in", DType::I32, n);
    need(ops, "ops", DType::I32, 3 * k);
    need(out, "out", DType::I32, k * n);
    gpu::selftest_warp(in, ops, out, stream);
  });
  m.def("simt_selftest_barrier", [](TensorView out, int bx, int by, int bz, int gx, int gy, int64_t stream) {
    LLMK_CHECK(bx >= 1 && by >= 1 && bz >= 1 && gx >= 1 && gy >= 1 && bx * by * bz <= 1024, ValueError,
               "block/grid: dims >= 1 and at most 1024 threads");
    need(out, "out", DType::I32, int64_t(gx) * gy * bx * by * bz * 10);
    gpu::selftest_barrier(out, bx, by, bz, gx, gy, stream);
  });
  m.def("simt_selftest_block", [](TensorView x, TensorView out, TensorView xi, TensorView outi, int64_t stream) {
    LLMK_CHECK(x.ndim == 2 && x.size(1) % 32 == 0 && x.size(1) >= 32 && x.size(1) <= 1024 && x.size(0) >= 1,
               ValueError, "x: expected [rows, n] with n a multiple of 32 in [32, 1024]");
    need(x, "x", DType::F32, x.numel());
    need(out, "out", DType::F32, x.numel() * 5);
    need(xi, "xi", DType::I32, x.numel());
    need(outi, "outi", DType::I32, x.numel() * 2);
    gpu::selftest_block(x, out, xi, outi, stream);
  });
  m.def("simt_selftest_atomics", [](TensorView ic, TensorView uc, TensorView ull, TensorView f, int blocks,
                                    int threads, int64_t stream) {
    LLMK_CHECK(blocks >= 1 && threads >= 1 && threads <= 1024, ValueError, "blocks/threads: out of range");
    need(ic, "icount", DType::I32, 8);
    need(uc, "ucount", DType::I32, 2);
    need(ull, "ull", DType::I64, 1);
    need(f, "fsum", DType::F32, 1);
    gpu::selftest_atomics(ic, uc, ull, f, blocks, threads, stream);
  });
  m.def("simt_selftest_dynamic_smem", [](TensorView out, int64_t smem_bytes, bool opt_in, int64_t stream) {
    const int64_t n = rows_of(out, "out") - 1;
    LLMK_CHECK(n >= 0 && n * 4 <= smem_bytes && smem_bytes <= 227 * 1024, ValueError,
               "smem_bytes: must hold out.size(0) - 1 ints and be at most 227 KiB");
    need(out, "out", DType::I32, n + 1);
    gpu::selftest_dynamic_smem(out, smem_bytes, opt_in, stream);
  });
  m.def("simt_selftest_cp_async", [](TensorView src, TensorView src_bytes, TensorView out, int64_t stream) {
    const int64_t rows = rows_of(src, "src");
    LLMK_CHECK(rows >= 1 && rows <= 128, ValueError, "src: 1 to 128 rows, got ", rows);
    need(src, "src", DType::I32, rows * 4);
    need(src_bytes, "src_bytes", DType::I32, rows);
    need(out, "out", DType::I32, 2 * rows * 4);
    gpu::selftest_cp_async(src, src_bytes, out, stream);
  });
  m.def("simt_selftest_ldmatrix", [](TensorView rows, TensorView perm, TensorView out, int64_t stream) {
    need(rows, "rows", DType::I16, 32 * 8);
    need(perm, "perm", DType::I32, 32);
    need(out, "out", DType::I32, 6 * 32 * 4);
#if defined(LLMK_SIMT)
    for (int i = 0; i < 32; ++i)
      LLMK_CHECK(perm.ptr<int>()[i] >= 0 && perm.ptr<int>()[i] < 32, ValueError, "perm: entries in [0, 32)");
#endif
    gpu::selftest_ldmatrix(rows, perm, out, stream);
  });
  m.def("simt_selftest_mma", [](TensorView a, TensorView b, TensorView c, TensorView d, bool fp16, int64_t stream) {
    need(a, "a", DType::I32, 32 * 4);
    need(b, "b", DType::I32, 32 * 2);
    need(c, "c", DType::F32, 32 * 4);
    need(d, "d", DType::F32, 32 * 4);
    gpu::selftest_mma(a, b, c, d, fp16, stream);
  });
  m.def("simt_selftest_ldmatrix_mma", [](TensorView a, TensorView b, TensorView out, bool fp16, int64_t stream) {
    need(a, "a", DType::I16, 16 * 16);
    need(b, "b", DType::I16, 16 * 8);
    need(out, "out", DType::F32, 16 * 8);
    gpu::selftest_ldmatrix_mma(a, b, out, fp16, stream);
  });
  m.def("simt_selftest_convert", [](TensorView x, TensorView h, TensorView bf, TensorView back, TensorView pairs,
                                    TensorView math, int64_t stream) {
    const int64_t n = rows_of(x, "x");
    LLMK_CHECK(n >= 2 && n % 2 == 0, ValueError, "x: an even number of values >= 2, got ", n);
    need(x, "x", DType::F32, n);
    need(h, "half", DType::I16, n);
    need(bf, "bf16", DType::I16, n);
    need(back, "back", DType::F32, 2 * n);
    need(pairs, "pairs", DType::I32, n);
    need(math, "math", DType::F32, 8 * n);
    gpu::selftest_convert(x, h, bf, back, pairs, math, stream);
  });
#if defined(LLMK_SIMT)
  m.def("simt_selftest_fault", [](int kind, int64_t stream) { gpu::selftest_fault(kind, stream); });
  m.def("simt_selftest_spin", [](int iters, int threads, int64_t stream) {
    LLMK_CHECK(iters >= 0 && threads >= 32 && threads <= 1024 && threads % 32 == 0, ValueError,
               "iters/threads: iters >= 0, threads a multiple of 32 in [32, 1024]");
    gpu::selftest_spin(iters, threads, stream);
  });
  m.def("simt_stats", [] {
    const simt::emu::Stats s = simt::emu::stats();
    pybind11::dict d;
    d["launches"] = s.launches;
    d["blocks"] = s.blocks;
    d["switches"] = s.switches;
    d["barriers"] = s.barriers;
    d["collectives"] = s.collectives;
    return d;
  });
#endif
}

#else

void bind_simt_selftest(pybind11::module_&) {}  // no CUDA kernels in this build

#endif

}  // namespace llmk
