// RMSNorm and the fused residual-add + RMSNorm of a decoder layer (vLLM's rms_norm /
// fused_add_rms_norm), and the gated SiLU of its MLP (silu_and_mul). Row-wise math in
// norm_math.h, shared by the CPU and CUDA kernels.
#pragma once
#include <cstdint>

#include "common/dispatch.h"
#include "common/tensor.h"

// input/out/residual [rows, hidden] (last dim contiguous, any row stride), weight [hidden].
LLMK_DECLARE_KERNEL(rms_norm, (const TensorView& out, const TensorView& input, const TensorView& weight,
                               float eps, int64_t stream))
LLMK_DECLARE_KERNEL(fused_add_rms_norm, (const TensorView& input, const TensorView& residual,
                                         const TensorView& weight, float eps, int64_t stream))
// input [rows, 2 * d], out [rows, d]: out = silu(input[:, :d]) * input[:, d:].
LLMK_DECLARE_KERNEL(silu_and_mul, (const TensorView& out, const TensorView& input, int64_t stream))

namespace llmk {
void rms_norm(TensorView out, TensorView input, TensorView weight, double eps, int64_t stream);
void fused_add_rms_norm(TensorView input, TensorView residual, TensorView weight, double eps, int64_t stream);
void silu_and_mul(TensorView out, TensorView input, int64_t stream);
}  // namespace llmk
