// pybind11 conversion: DLPack capsule (or any object with __dlpack__) -> llmk::TensorView.
// Included by binding translation units only.
#pragma once
#include <pybind11/pybind11.h>

#include "common/dlpack.h"
#include "common/errors.h"
#include "common/tensor.h"

namespace llmk {

inline TensorView view_from_dlpack(const DLTensor& t) {
  TensorView v;
  LLMK_CHECK(t.ndim <= kMaxDims, ValueError, "tensors of more than ", kMaxDims,
             " dims are not supported, got ", t.ndim);
  LLMK_CHECK(t.dtype.lanes == 1, TypeError, "vector dtypes (lanes > 1) are not supported");
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  v.ndim = t.ndim;
  switch (t.device.device_type) {
    case kDLCPU: case kDLCUDAHost: v.device = DeviceType::CPU; break;
    case kDLCUDA: case kDLCUDAManaged: v.device = DeviceType::CUDA; break;
    default: v.device = DeviceType::Other;
  }
  v.device_id = t.device.device_id;
  const uint8_t c = t.dtype.code, b = t.dtype.bits;
  v.dtype = c == kDLFloat && b == 32   ? DType::F32
            : c == kDLFloat && b == 16 ? DType::F16
            : c == kDLBfloat && b == 16 ? DType::BF16
            : c == kDLFloat && b == 64 ? DType::F64
            : c == kDLInt && b == 64   ? DType::I64
            : c == kDLInt && b == 32   ? DType::I32
            : c == kDLInt && b == 16   ? DType::I16
            : c == kDLInt && b == 8    ? DType::I8
            : c == kDLUInt && b == 8   ? DType::U8
            : c == kDLBool             ? DType::Bool
                                       : DType::Other;
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides ? t.strides[i] : expect;
    expect *= t.shape[i];
  }
  return v;
}

}  // namespace llmk

namespace pybind11 {
namespace detail {

template <>
struct type_caster<llmk::TensorView> {
  PYBIND11_TYPE_CASTER(llmk::TensorView, const_name("DLPackTensor"));

  bool load(handle src, bool) {
    object cap;
    if (PyCapsule_CheckExact(src.ptr())) {
      cap = reinterpret_borrow<object>(src);
    } else if (hasattr(src, "__dlpack__")) {
      cap = src.attr("__dlpack__")();  // e.g. numpy arrays; src keeps the memory alive
    } else {
      return false;
    }
    if (!PyCapsule_IsValid(cap.ptr(), "dltensor"))
      throw llmk::TypeError("expected an unconsumed DLPack capsule named 'dltensor'");
    auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
    value = llmk::view_from_dlpack(mt->dl_tensor);
    return true;
  }

  static handle cast(const llmk::TensorView&, return_value_policy, handle) {
    throw llmk::TypeError("TensorView cannot be returned to Python");
  }
};

}  // namespace detail
}  // namespace pybind11
