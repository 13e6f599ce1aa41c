// Scalar element access of the CPU kernels that take float / bf16 (as uint16_t) / fp16 (as
// _Float16) rows: load to fp32, store from fp32 (round to nearest even).
#pragma once
#include <cstdint>

#include "attention/attn_vec_cpu.h"  // the bf16 conversions

LLMK_NS_BEGIN

template <typename T> inline float load(T v) { return static_cast<float>(v); }
template <> inline float load<uint16_t>(uint16_t v) { return attn::bf16_to_f32(v); }
template <typename T> inline T store(float v) { return static_cast<T>(v); }
template <> inline uint16_t store<uint16_t>(float v) { return attn::f32_to_bf16(v); }

LLMK_NS_END
