// Memory-overlap checks shared by every op's front end (host code only; reads no tensor data, so
// they also run for CUDA tensors and under graph capture).
#pragma once
#include "common/errors.h"
#include "common/tensor.h"

namespace llmk {

// Whether two tensors share bytes. Same = exactly the same elements in the same layout; views that
// interleave without sharing a byte (slices of a fused qkv, the K and V halves of one cache) are None.
enum class Overlap { None, Same, Partial };
Overlap memory_overlap(const TensorView& a, const TensorView& b);

// For an output `b` and another argument `a`: ValueError naming both unless they share no byte,
// or, with allow_same (ops documented as in place), are exactly the same tensor.
void check_no_overlap(const TensorView& a, const char* an, const TensorView& b, const char* bn,
                      bool allow_same = false);

}  // namespace llmk
