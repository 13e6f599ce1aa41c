// One head row's rotary rotation on the CPU, shared by the rotary op (rotary_cpu.cpp) and the K/Q
// rotation of flash_attn_with_kvcache's append (attention/flash_attn_cpu.cpp). The pairing is a
// template argument so that the loop vectorises (chosen at run time per element, it stayed scalar:
// ~40 us of a 29-sequence decode step's ~190 us attention call per layer went to it).
#pragma once
#include "common/vec_cpu.h"
#include "rotary/rotary_math.h"

LLMK_NS_BEGIN

// x[a], x[b] of pair i -> rope_rotate with cos[i], sin[i], for i < half (rotary_dim = 2 * half);
// Neox: pairs (i, i + half), else (2i, 2i + 1). In place; fp32 math, one rounding.
template <DType DT, bool Neox, typename T = vec::elem_t<DT>>
inline void rotate_head(T* x, const T* cos, const T* sin, int half) {
#pragma omp simd
  for (int i = 0; i < half; ++i) {
    int a, b;
    rope_pair(i, 2 * half, Neox, a, b);
    float u = vec::to_f32<DT>(x[a]), v = vec::to_f32<DT>(x[b]);
    rope_rotate(u, v, vec::to_f32<DT>(cos[i]), vec::to_f32<DT>(sin[i]));
    x[a] = vec::from_f32<DT>(u);
    x[b] = vec::from_f32<DT>(v);
  }
}

LLMK_NS_END
