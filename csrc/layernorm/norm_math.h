// Row math of the layernorm family, shared by the CPU and CUDA kernels. Statistics in fp32 (as HF
// and vLLM compute them for every dtype); a fused residual add rounds the sum to the storage
// dtype first, so the norm sees exactly the residual that is stored. As in HF, x * inv is rounded
// to the storage dtype before the weight multiply (the identity in fp32).
#pragma once
#include <cmath>

#include "common/macros.h"

LLMK_NS_BEGIN

// 1 / sqrt(mean(x^2) + eps) from the sum of squares of a row of n elements.
LLMK_HD float rms_inv(float sum_sq, int n, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(n) + eps);
}

LLMK_NS_END
