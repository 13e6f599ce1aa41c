// Rotary position embedding in place on query/key rows (vLLM's rotary_embedding): each head's
// first rot_dim features are rotated by the angles of the token's position, read from a
// cos/sin cache [max_position, rot_dim] (cos in the first half, sin in the second). NeoX style
// pairs feature i with i + rot_dim/2 (Llama, Qwen2, Mistral); GPT-J style pairs 2i with 2i+1.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// positions [T] int32/int64; query [T, heads * head_size] or [T, heads, head_size] (any token and
// head strides, features contiguous; rotary_heads() below), key likewise or null; cos_sin_cache
// [max_position, rot_dim], rows contiguous.
LLMK_DECLARE_KERNEL(rotary_embedding, (const TensorView& positions, const TensorView& query, const TensorView* key,
                                       int head_size, const TensorView& cos_sin_cache, bool is_neox, int64_t stream))

namespace llmk {
// Heads and head stride (elements) of a query / key tensor in either accepted layout.
inline int rotary_heads(const TensorView& t, int head_size) {
  return static_cast<int>(t.ndim == 3 ? t.size(1) : t.size(1) / head_size);
}
inline int64_t rotary_head_stride(const TensorView& t, int head_size) {
  return t.ndim == 3 ? t.stride(1) : head_size;
}

void rotary_embedding(TensorView positions, TensorView query, std::optional<TensorView> key, int64_t head_size,
                      TensorView cos_sin_cache, bool is_neox, int64_t stream);
}  // namespace llmk
