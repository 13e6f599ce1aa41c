// Weight-only quantised projections: y = x W^T (+ bias) with W kept in GGUF precision, packed by
// ops/linear_gguf.py into the layout of quant_layout.h and dequantised inside the kernel.
// x, bias and out are float32 or bfloat16 (fp32 accumulation); x is quantised to int8 per 32 k
// values in the kernel (llama.cpp's Q8 activations), so the sums are integer dot products.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// x [M, K], weight_q uint8 [panels, K / block, block_bytes] (panels = ceil(N / 16), or twice that
// with gated: gate panel i at 2i, up panel i at 2i + 1, out = silu(gate) * up), out [M, N].
LLMK_DECLARE_KERNEL(linear_quant, (const TensorView& x, const TensorView& weight_q, int64_t out_features,
                                   int64_t layout, const TensorView* bias, bool gated, const TensorView& out,
                                   int64_t stream))

// out [T, K] = rows `indices` [T] of the dequantised weight (an embedding lookup of a tied head).
LLMK_DECLARE_KERNEL(quant_weight_rows, (const TensorView& weight_q, int64_t layout, const TensorView& indices,
                                        const TensorView& out, int64_t stream))

namespace llmk {
void linear_quant(TensorView x, TensorView weight_q, int64_t out_features, int64_t layout,
                  std::optional<TensorView> bias, TensorView out, int64_t stream);
void linear_quant_silu_mul(TensorView x, TensorView weight_q, int64_t out_features, int64_t layout,
                           TensorView out, int64_t stream);
void quant_weight_rows(TensorView weight_q, int64_t out_features, int64_t layout, TensorView indices,
                       TensorView out, int64_t stream);
}  // namespace llmk
