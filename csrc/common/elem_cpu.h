// Scalar element access of the CPU kernels that take float / bf16 (as uint16_t) / fp16 (as
// _Float16) rows: load to fp32, store from fp32 (round to nearest even), and the dtype dispatch.
#pragma once
#include <cstdint>

#include "attention/attn_vec_cpu.h"  // the bf16 conversions

LLMK_NS_BEGIN

template <typename T> inline float load(T v) { return static_cast<float>(v); }
template <> inline float load<uint16_t>(uint16_t v) { return attn::bf16_to_f32(v); }
template <typename T> inline T store(float v) { return static_cast<T>(v); }
template <> inline uint16_t store<uint16_t>(float v) { return attn::f32_to_bf16(v); }

// f(tag) with tag a null pointer to the element type of a float tensor's dtype.
template <typename F>
inline void dispatch_elem(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(static_cast<float*>(nullptr)); break;
    case DType::BF16: f(static_cast<uint16_t*>(nullptr)); break;
    default: f(static_cast<_Float16*>(nullptr)); break;
  }
}

LLMK_NS_END
