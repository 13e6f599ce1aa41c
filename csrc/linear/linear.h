// CPU projections y = x W^T (+ bias), layout of torch.nn.functional.linear.
// linear_small_m: few rows of x (decode steps), W as it is; a matrix-vector product bound by
// reading W once. linear_packed: any number of rows, W packed once at load time.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// x [M, K], weight [N, K] (rows contiguous), bias [N] or null, out [M, N] contiguous.
LLMK_DECLARE_KERNEL(linear_small_m, (const TensorView& x, const TensorView& weight,
                                     const TensorView* bias, const TensorView& out, int64_t stream))

// out [M, N] = x [M, K] W^T + bias, fp32, W pre-packed into panels [ceil(N/16), K, 16] (gemm_cpu.h);
// or bf16 x, bias and out with W packed in k pairs [ceil(N/16), ceil(K/2), 16, 2] (gemm_bf16_cpu.h).
LLMK_DECLARE_KERNEL(linear_packed, (const TensorView& x, const TensorView& weight_packed, int64_t out_features,
                                    const TensorView* bias, const TensorView& out, int64_t stream))

// out [M, N] = silu(x Wg^T) * (x Wu^T), fp32: the MLP's gate/up GEMM with the gated SiLU as its
// epilogue. weight_pairs [2 * ceil(N/16), K, 16]: the packed gate and up panels interleaved (gate
// panel i at 2i, up panel i at 2i + 1); bf16: the same order of k-pair panels [2 * ceil(N/16), ceil(K/2), 16, 2].
LLMK_DECLARE_KERNEL(linear_packed_silu_mul, (const TensorView& x, const TensorView& weight_pairs,
                                             int64_t out_features, const TensorView& out, int64_t stream))

// out [T, K] = the rows `indices` [T] of the weight packed in weight_packed (an embedding lookup of
// a tied LM head); K is out's (the bf16 pair layout cannot tell an odd K).
LLMK_DECLARE_KERNEL(packed_weight_rows, (const TensorView& weight_packed, const TensorView& indices,
                                         const TensorView& out, int64_t stream))

namespace llmk {
void packed_weight_rows(TensorView weight_packed, int64_t out_features, TensorView indices, TensorView out,
                        int64_t stream);
void linear_packed(TensorView x, TensorView weight_packed, int64_t out_features, std::optional<TensorView> bias,
                   TensorView out, int64_t stream);
void linear_packed_silu_mul(TensorView x, TensorView weight_pairs, int64_t out_features, TensorView out,
                            int64_t stream);
void linear_small_m(TensorView x, TensorView weight, std::optional<TensorView> bias, TensorView out,
                    int64_t stream);
}  // namespace llmk
