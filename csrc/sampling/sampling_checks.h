// Argument checks of the sampling family (host code of the fronts only).
#pragma once
#include <optional>

#include "common/checks.h"
#include "sampling/sampling.h"

namespace llmk {

enum class ParamKind { Temperature, TopK, TopP, MinP, Repetition, Penalty };

// A per-row parameter from (tensor or None, scalar): the tensor must be 1-D of size `batch` or 1,
// on x's device, float32 (int32/int64 for TopK); values are range-checked (the scalar always, the
// tensor when the host can read it). `vocab` bounds top_k.
RowParam row_param(const std::optional<TensorView>& arr, double val, const char* name, ParamKind kind,
                   int64_t batch, int64_t vocab, const TensorView& like);
// seed / offset: int64 tensor [1] or [batch] on x's device, or a scalar (any 64-bit value).
RowParam seed_param(const std::optional<TensorView>& arr, int64_t val, const char* name, int64_t batch,
                    const TensorView& like);
// A [batch] int32/int64 output (or counter) tensor on x's device.
// A token bitmask of the fused samplers: int32 [rows..., words] (dims before the last given by
// `lead`) on x's device, last dim contiguous, words covering the vocabulary (ceil(vocab / 32) or
// more; bits past the vocabulary are ignored).
void check_bitmask(const TensorView& t, const char* name, std::initializer_list<int64_t> lead, int64_t vocab,
                   const TensorView& like, const char* layout);
void check_row_vector(const TensorView& t, const char* name, int64_t batch, const TensorView& like,
                      bool index_dtype);

}  // namespace llmk
