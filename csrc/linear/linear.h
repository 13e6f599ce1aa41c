// linear_small_m: y = x W^T (+ bias) for few rows of x (decode steps), where a matmul is a
// matrix-vector product bound by reading W once. Layout follows torch.nn.functional.linear.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// x [M, K], weight [N, K] (rows contiguous), bias [N] or null, out [M, N] contiguous.
LLMK_DECLARE_KERNEL(linear_small_m, (const TensorView& x, const TensorView& weight,
                                     const TensorView* bias, const TensorView& out, int64_t stream))

namespace llmk {
void linear_small_m(TensorView x, TensorView weight, std::optional<TensorView> bias, TensorView out,
                    int64_t stream);
}  // namespace llmk
