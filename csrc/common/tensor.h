// TensorView: what C++ sees of a tensor that crossed the binding boundary through DLPack.
// Non-owning; the Python caller keeps the tensor alive for the duration of the call.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/macros.h"

namespace llmk {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, Bool, Other };
enum class DeviceType : uint8_t { CPU, CUDA, Other };

inline const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F64: return "float64";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::I16: return "int16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
    default: return "unsupported dtype";
  }
}

LLMK_ALWAYS_INLINE size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    default: return 1;
  }
}

constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::Other;
  DeviceType device = DeviceType::CPU;
  int device_id = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // elements

  LLMK_ALWAYS_INLINE int64_t size(int i) const { return shape[i < 0 ? i + ndim : i]; }
  LLMK_ALWAYS_INLINE int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  LLMK_ALWAYS_INLINE size_t elem_size() const { return dtype_size(dtype); }
  LLMK_ALWAYS_INLINE bool is_cuda() const { return device == DeviceType::CUDA; }
  LLMK_ALWAYS_INLINE bool is_cpu() const { return device == DeviceType::CPU; }
  LLMK_ALWAYS_INLINE int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  // Row-major contiguity of dims [from, ndim); size-1 dims may have any stride.
  LLMK_ALWAYS_INLINE bool is_contiguous(int from = 0) const {
    for (int i = from; i < ndim; ++i)
      if (shape[i] == 0) return true;  // no elements: any strides will do (torch's rule)
    int64_t expect = 1;
    for (int i = ndim - 1; i >= from; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
  template <typename T>
  LLMK_ALWAYS_INLINE T* ptr() const { return static_cast<T*>(data); }
  LLMK_ALWAYS_INLINE char* bytes() const { return static_cast<char*>(data); }
};

}  // namespace llmk
