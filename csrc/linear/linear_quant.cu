// CUDA weight-only quantised projections on quant_layout.h's packed panels: the weights are
// dequantised in registers (d * u + m per sub-block) and multiplied with x as it is (no activation
// quantisation on the GPU: the FMA units have room, the bytes read are the codes').
//
// One thread block per (panel, tile of kRows rows of x); its 128 threads are 16 rows of the panel
// x 8 slices of the sub-blocks. Each thread dequantises its row's codes of every 8th sub-block and
// dots them with the tile's rows of x; a shared-memory sum over the slices gives the panel's
// outputs. A gate/up pair runs both panels in the same block and applies the gated SiLU.
#include <cstdint>
#include <type_traits>

#include "common/elem_device.cuh"
#include "common/grid.h"
#include "common/simt.h"
#include "linear/linear_quant.h"
#include "linear/quant_layout.h"

namespace llmk {
namespace gpu {

namespace {

constexpr int kSlices = 8;
constexpr int kThreads = qlayout::kPanel * kSlices;
constexpr int kRows = 4;

LLMK_DEVICE float half_bits_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// acc[r] += sum over this thread's sub-blocks of W[f][k] * x[r][k] for one panel.
template <typename T>
LLMK_DEVICE void panel_dot(const uint8_t* panel, const qlayout::Layout& L, int64_t nb, const T* x, int64_t ldx,
                           int rows, int f, int slice, float* acc) {
  const int64_t bb = L.block_bytes();
  for (int64_t b = slice; b < nb; b += kSlices) {
    const uint8_t* blk = panel + b * bb;
    const float d = half_bits_f32(qlayout::scale_bits(blk, L, f));
    const float m = half_bits_f32(qlayout::offset_bits(blk, L, f));
    const int64_t k0 = b * L.block;
    for (int k = 0; k < L.block; ++k) {
      const float w = d * float(qlayout::code_at(blk, L, f, k)) + m;
      for (int r = 0; r < rows; ++r) acc[r] += w * ld(x[r * ldx + k0 + k]);
    }
  }
}

template <typename T>
__global__ void linear_quant_kernel(const T* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* wq, int64_t N,
                                    int layout, const T* bias, bool gated, T* out, int64_t ldo, int64_t tile0) {
  __shared__ float part[2][kSlices][kRows][qlayout::kPanel];
  const qlayout::Layout L = qlayout::layout_of(layout);
  const int64_t nb = K / L.block, pstride = nb * L.block_bytes();
  const int64_t p = blockIdx.x, m0 = (tile0 + blockIdx.y) * kRows;
  const int rows = int(M - m0 < kRows ? M - m0 : kRows);
  const int f = threadIdx.x % qlayout::kPanel, slice = threadIdx.x / qlayout::kPanel;
  const T* xt = x + m0 * ldx;
  for (int h = 0; h < (gated ? 2 : 1); ++h) {
    float acc[kRows] = {0.f, 0.f, 0.f, 0.f};
    panel_dot(wq + (gated ? 2 * p + h : p) * pstride, L, nb, xt, ldx, rows, f, slice, acc);
    for (int r = 0; r < kRows; ++r) part[h][slice][r][f] = acc[r];
  }
  __syncthreads();
  if (threadIdx.x >= rows * qlayout::kPanel) return;
  const int r = threadIdx.x / qlayout::kPanel, n = int(p * qlayout::kPanel) + f;
  if (n >= N) return;
  float v = 0.f, u = 0.f;
  for (int s = 0; s < kSlices; ++s) {
    v += part[0][s][r][f];
    if (gated) u += part[1][s][r][f];
  }
  if (gated) v = v / (1.f + __expf(-v)) * u;
  else if (bias) v += ld(bias[n]);
  out[(m0 + r) * ldo + n] = st<T>(v);
}

template <typename T>
__global__ void quant_rows_kernel(const uint8_t* wq, int layout, const void* idx, bool idx64, int64_t K, T* out,
                                  int64_t row0) {
  const qlayout::Layout L = qlayout::layout_of(layout);
  const int64_t t = row0 + blockIdx.y, nb = K / L.block;
  const int64_t n = idx64 ? static_cast<const int64_t*>(idx)[t] : static_cast<const int32_t*>(idx)[t];
  const uint8_t* panel = wq + (n / qlayout::kPanel) * nb * L.block_bytes();
  const int f = int(n % qlayout::kPanel);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const uint8_t* blk = panel + (k / L.block) * L.block_bytes();
    const float v = half_bits_f32(qlayout::scale_bits(blk, L, f)) * float(qlayout::code_at(blk, L, f, int(k % L.block))) +
                    half_bits_f32(qlayout::offset_bits(blk, L, f));
    out[t * K + k] = st<T>(v);
  }
}

}  // namespace

void linear_quant(const TensorView& x, const TensorView& weight_q, int64_t out_features, int64_t layout,
                  const TensorView* bias, bool gated, const TensorView& out, int64_t stream) {
  const int64_t M = x.size(0), K = x.size(1);
  const unsigned panels = unsigned((out_features + qlayout::kPanel - 1) / qlayout::kPanel);
  by_dtype(x.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for_each_grid_chunk((M + kRows - 1) / kRows, [&](int64_t first, unsigned count) {
      LLMK_LAUNCH(linear_quant_kernel<T>, dim3(panels, count), kThreads, 0, stream)(
          x.ptr<const T>(), x.stride(0), M, K, weight_q.ptr<const uint8_t>(), out_features, int(layout),
          bias ? bias->ptr<const T>() : nullptr, gated, out.ptr<T>(), out.stride(0), first);
    });
  });
}

void quant_weight_rows(const TensorView& weight_q, int64_t layout, const TensorView& indices, const TensorView& out,
                       int64_t stream) {
  by_dtype(out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for_each_grid_chunk(indices.size(0), [&](int64_t first, unsigned count) {
      LLMK_LAUNCH(quant_rows_kernel<T>, dim3(1, count), 128, 0, stream)(
          weight_q.ptr<const uint8_t>(), int(layout), indices.data, indices.dtype == DType::I64, out.size(1),
          out.ptr<T>(), first);
    });
  });
}

}  // namespace gpu
}  // namespace llmk
