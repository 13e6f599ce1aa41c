// Argument checks shared by every op's front end (host code only). Each throws a ValueError or
// TypeError whose message starts with the argument's name.
#pragma once
#include <initializer_list>
#include <string>

#include "common/errors.h"
#include "common/tensor.h"

namespace llmk {

std::string shape_str(const TensorView& t);
const char* device_str(const TensorView& t);

// dims: expected sizes, -1 = any. layout: a human name for the dims, e.g. "[num_tokens, num_heads, head_dim]".
void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> dims,
                 const char* layout);
void check_ndim(const TensorView& t, const char* name, int ndim, const char* layout);
void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what);
void check_float(const TensorView& t, const char* name);       // float32 / float16 / bfloat16
void check_dtype(const TensorView& t, const char* name, DType dtype);
void check_index(const TensorView& t, const char* name);       // int32 / int64
void check_same_dtype(const TensorView& a, const char* an, const TensorView& b, const char* bn);
void check_same_device(const TensorView& a, const char* an, const TensorView& b, const char* bn);
void check_on_cpu(const TensorView& t, const char* name);
void check_contiguous(const TensorView& t, const char* name, int from_dim = 0);
void check_last_dim_contiguous(const TensorView& t, const char* name);

// Flat entry i of a contiguous int32/int64 tensor, as int64; host-accessible memory only.
int64_t index_at(const TensorView& t, int64_t i);
// True when the data pointer can be read by the host: CPU tensors, and all tensors in the SIMT
// emulator. CUDA tensors are read only under LLMKERN_DEBUG_CHECKS=1 (it synchronises).
bool host_readable(const TensorView& t);
bool debug_checks_enabled();
// Checks lo <= v < hi for every entry (entries equal to `skip` are allowed). On CUDA tensors it
// only runs under LLMKERN_DEBUG_CHECKS=1 (copies to the host, which breaks graph capture).
void check_index_range(const TensorView& t, const char* name, int64_t lo, int64_t hi,
                       const char* what, bool allow_minus_one = false);

}  // namespace llmk
