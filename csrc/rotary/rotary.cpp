#include "rotary/rotary.h"

#include "common/checks.h"
#include "common/overlap.h"

namespace llmk {

namespace {

// query / key: [T, heads * head_size] or [T, heads, head_size] (any token and head strides),
// floating point like the cache, on its device, features contiguous.
void check_heads(const TensorView& t, const char* name, const TensorView& positions, const TensorView& cache,
                 int64_t head_size) {
  LLMK_CHECK(t.ndim == 2 || t.ndim == 3, ValueError, name,
             ": expected [num_tokens, heads * head_size] or [num_tokens, heads, head_size], got shape ",
             shape_str(t));
  check_float(t, name);
  check_same_dtype(t, name, cache, "cos_sin_cache");
  check_same_device(t, name, cache, "cos_sin_cache");
  check_dim(t, name, 0, positions.numel(), "num_tokens, from positions");
  if (t.ndim == 3) {
    check_dim(t, name, 2, head_size, "head_size");
  } else {
    LLMK_CHECK(t.size(1) % head_size == 0, ValueError, name, ": the last dimension (", t.size(1),
               ") is not a multiple of head_size (", head_size, ")");
  }
  check_last_dim_contiguous(t, name);
}

}  // namespace

void rotary_embedding(TensorView positions, TensorView query, std::optional<TensorView> key, int64_t head_size,
                      TensorView cos_sin_cache, bool is_neox, int64_t stream) {
  check_ndim(positions, "positions", 1, "[num_tokens]");
  check_index(positions, "positions");
  check_contiguous(positions, "positions");
  check_ndim(cos_sin_cache, "cos_sin_cache", 2, "[max_position, rot_dim]");
  check_float(cos_sin_cache, "cos_sin_cache");
  check_contiguous(cos_sin_cache, "cos_sin_cache");
  check_same_device(positions, "positions", cos_sin_cache, "cos_sin_cache");
  LLMK_CHECK(head_size > 0, ValueError, "head_size: must be positive, got ", head_size);
  const int64_t rot = cos_sin_cache.size(1);
  LLMK_CHECK(rot > 0 && rot % 2 == 0 && rot <= head_size, ValueError, "cos_sin_cache: rot_dim (", rot,
             ") must be even, positive and at most head_size (", head_size, ")");
  check_heads(query, "query", positions, cos_sin_cache, head_size);
  if (key) check_heads(*key, "key", positions, cos_sin_cache, head_size);
  // Rotated in place: query and key must be separate rows (views of one fused qkv are fine).
  for (const TensorView* t : {&query, key ? &*key : nullptr}) {
    if (!t) continue;
    const char* n = t == &query ? "query" : "key";
    check_no_overlap(positions, "positions", *t, n);
    check_no_overlap(cos_sin_cache, "cos_sin_cache", *t, n);
  }
  if (key) check_no_overlap(query, "query", *key, "key");
  check_index_range(positions, "positions", 0, cos_sin_cache.size(0), "cos_sin_cache rows (max_position)");
  if (positions.numel() == 0) return;
  LLMK_RUN(query, rotary_embedding, positions, query, key ? &*key : nullptr, static_cast<int>(head_size),
           cos_sin_cache, is_neox, stream);
}

}  // namespace llmk
