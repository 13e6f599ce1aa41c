// Python entry points of the Hopper layer's self-test kernels (simt_selftest_hopper.cu): in
// llmkern._simt always, in llmkern._C when it was compiled for sm_90a (else they raise).
#include "common/bindings.h"
#include "common/checks.h"
#include "simt/simt_selftest_hopper.h"
#include "common/sm90.h"

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

void need_sm90a() {
#if !defined(LLMK_SIMT)
#if !defined(LLMK_HAS_SM90A)
  throw NotImplementedError("Hopper self-tests: this build has no sm_90a code (LLMKERN_CUDA_ARCHS lacks 90a)");
#else
  LLMK_CHECK(gpu::device_is_sm90(), NotImplementedError, "Hopper self-tests: the current GPU is not sm_90");
#endif
#endif
}

}  // namespace

void bind_simt_selftest_hopper(pybind11::module_& m) {
  m.def("simt_selftest_wgmma", [](TensorView a, TensorView b, TensorView a_regs, TensorView c, TensorView d, int n,
                                  bool trans_b, bool use_regs, int swizzle, bool fp16, int64_t stream) {
    LLMK_CHECK(n == 64 || n == 128, ValueError, "n: 64 or 128, got ", n);
    LLMK_CHECK(swizzle == 0 || swizzle == 32 || swizzle == 64 || swizzle == 128, ValueError,
               "swizzle: 0, 32, 64 or 128, got ", swizzle);
    need(a, "a", DType::I16, 64 * 64);
    need(b, "b", DType::I16, int64_t(n) * 64);
    need(a_regs, "a_regs", DType::I32, 4 * 128 * 4);
    need(c, "c", DType::F32, 64 * int64_t(n));
    need(d, "d", DType::F32, 64 * int64_t(n));
    need_sm90a();
    gpu::selftest_wgmma(a, b, a_regs, c, d, n, trans_b, use_regs, swizzle, fp16, stream);
  });
  m.def("simt_selftest_tma", [](TensorView src, std::vector<int> coords, std::vector<int> box, int swizzle,
                                TensorView out, int64_t stream) {
    LLMK_CHECK(src.ndim == 2 || src.ndim == 3, ValueError, "src: 2 or 3 dims, got ", src.ndim);
    LLMK_CHECK(int64_t(coords.size()) == src.ndim && int64_t(box.size()) == src.ndim, ValueError,
               "coords/box: one entry per dim of src");
    int64_t n = 1;
    for (int b : box) {
      LLMK_CHECK(b >= 1 && b <= 256, ValueError, "box: entries in [1, 256]");
      n *= b;
    }
    LLMK_CHECK(n * 2 <= 64 * 1024, ValueError, "box: at most 64 KiB");
    need(src, "src", DType::I16, src.numel());
    need(out, "out", DType::I16, n);
    need_sm90a();
    gpu::selftest_tma(src, coords.data(), box.data(), swizzle, out, stream);
  });
  m.def("simt_selftest_mbarrier", [](TensorView src, int rounds, TensorView out, TensorView probe, int64_t stream) {
    LLMK_CHECK(rounds >= 1 && rounds <= 64, ValueError, "rounds: 1 to 64, got ", rounds);
    need(src, "src", DType::I16, int64_t(rounds) * 16 * 32);
    need(out, "out", DType::I32, int64_t(rounds) * 64);
    need(probe, "probe", DType::I32, 8);
    need_sm90a();
    gpu::selftest_mbarrier(src, rounds, out, probe, stream);
  });
#if defined(LLMK_SIMT)
  m.def("simt_selftest_hopper_fault", [](int kind, int64_t stream) {
    LLMK_CHECK(kind >= 0 && kind <= 4, ValueError, "kind: 0 to 4, got ", kind);
    gpu::selftest_hopper_fault(kind, stream);
  });
#endif
}

#else

void bind_simt_selftest_hopper(pybind11::module_&) {}  // no CUDA kernels in this build

#endif

}  // namespace llmk
