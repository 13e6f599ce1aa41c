// CUDA kernels of the layernorm family: one thread block per row; the sum of squares is a block
// reduction, and each thread re-reads only the elements it wrote (no second barrier needed).
#include <cstdint>

#include "common/elem_device.cuh"
#include "common/simt.h"
#include "common/simt_block.h"
#include "layernorm/layernorm.h"
#include "layernorm/norm_math.h"

namespace llmk {
namespace gpu {

namespace {

constexpr int kThreads = 256;

// out[r] = rmsnorm(x[r]) * w; with a residual: res[r] = x[r] + res[r] first, and out = x (in place).
template <typename T, bool Fused>
__global__ void rms_norm_kernel(T* out, int64_t out_stride, T* x, int64_t x_stride, T* res, int64_t res_stride,
                                const T* w, int n, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  T* xr = x + r * x_stride;
  T* hr = Fused ? res + r * res_stride : xr;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = ld(xr[i]);
    if (Fused) {
      const T h = st<T>(v + ld(hr[i]));
      hr[i] = h;
      v = ld(h);
    }
    ss += v * v;
  }
  const float inv = rms_inv(simt::block_reduce_sum(ss, scratch), n, eps);
  T* o = out + r * out_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = st<T>(ld(st<T>(ld(hr[i]) * inv)) * ld(w[i]));
}

template <typename T>
__global__ void silu_and_mul_kernel(T* out, int64_t out_stride, const T* x, int64_t x_stride, int d) {
  const T* g = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  T* o = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float a = ld(g[i]);
    o[i] = st<T>(a / (1.0f + expf(-a)) * ld(g[d + i]));
  }
}

template <typename T, bool Fused>
void launch_norm(const TensorView& out, const TensorView& x, const TensorView* res, const TensorView& w,
                 float eps, int64_t stream) {
  const unsigned rows = static_cast<unsigned>(x.size(0));
  LLMK_LAUNCH((rms_norm_kernel<T, Fused>), rows, kThreads, 0, stream)(
      out.ptr<T>(), out.stride(0), x.ptr<T>(), x.stride(0), res ? res->ptr<T>() : nullptr,
      res ? res->stride(0) : 0, w.ptr<const T>(), static_cast<int>(x.size(1)), eps);
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight, float eps,
              int64_t stream) {
  by_dtype(input.dtype, [&](auto* tag) {
    launch_norm<std::remove_pointer_t<decltype(tag)>, false>(out, input, nullptr, weight, eps, stream);
  });
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView& weight,
                        float eps, int64_t stream) {
  by_dtype(input.dtype, [&](auto* tag) {
    launch_norm<std::remove_pointer_t<decltype(tag)>, true>(input, input, &residual, weight, eps, stream);
  });
}

void silu_and_mul(const TensorView& out, const TensorView& input, int64_t stream) {
  by_dtype(input.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LLMK_LAUNCH(silu_and_mul_kernel<T>, static_cast<unsigned>(input.size(0)), kThreads, 0, stream)(
        out.ptr<T>(), out.stride(0), input.ptr<const T>(), input.stride(0), static_cast<int>(out.size(1)));
  });
}

}  // namespace gpu
}  // namespace llmk
