// Rotary position embedding in place on query/key rows (vLLM's rotary_embedding): each head's
// first rot_dim features are rotated by the angles of the token's position, read from a
// cos/sin cache [max_position, rot_dim] (cos in the first half, sin in the second). NeoX style
// pairs feature i with i + rot_dim/2 (Llama, Qwen2, Mistral); GPT-J style pairs 2i with 2i+1.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// positions [T] int32/int64; query [T, heads * head_size] and key [T, kv_heads * head_size] or
// null (last dim contiguous, any row stride); cos_sin_cache [max_position, rot_dim], rows contiguous.
LLMK_DECLARE_KERNEL(rotary_embedding, (const TensorView& positions, const TensorView& query, const TensorView* key,
                                       int head_size, const TensorView& cos_sin_cache, bool is_neox, int64_t stream))

namespace llmk {
void rotary_embedding(TensorView positions, TensorView query, std::optional<TensorView> key, int64_t head_size,
                      TensorView cos_sin_cache, bool is_neox, int64_t stream);
}  // namespace llmk
