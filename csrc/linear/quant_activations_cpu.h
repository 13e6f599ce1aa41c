// The activations of the weight-only quantised projections (linear_quant_cpu.cpp): x rows
// quantised to int8 per 32 k values (scale dx = max|x| / 127, round to nearest even), each block
// with the sums its offset term needs.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/macros.h"
#include "common/parallel.h"
#include "common/vec_cpu.h"
#include "linear/quant_layout.h"

LLMK_NS_BEGIN
namespace qact {

using qlayout::kXBlock;

constexpr int kMeta = 4;     // per activation block: dx, dx * sum(q[0:16]), dx * sum(q[16:32]), both

#if defined(__AVX512F__)
// One 32-value block of x (fp32) -> 32 int8 codes and its meta, as the scalar loop below computes
// it (same scale, same round-to-nearest-even), 16 lanes at a time.
LLMK_ALWAYS_INLINE void quantize_block16x2(__m512 a, __m512 b, int8_t* qr, float* mt) {
  const __m512 amax_v = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
  const float amax = _mm512_reduce_max_ps(amax_v);
  const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  const __m512 iv = _mm512_set1_ps(inv);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, iv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, iv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qr), _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + 16), _mm512_cvtsepi32_epi8(qb));
  const int s0 = _mm512_reduce_add_epi32(qa), s1 = _mm512_reduce_add_epi32(qb);
  mt[0] = dx;
  mt[1] = dx * float(s0);
  mt[2] = dx * float(s1);
  mt[3] = dx * float(s0 + s1);
}
#endif

// Activation rows quantised per 32 k: q [M, K] int8, meta [M, K / 32, 4].
template <DType DT, typename T = vec::elem_t<DT>>
void quantize_rows(const T* x, int64_t ldx, int64_t M, int64_t K, int8_t* q, float* meta) {
  const int64_t nb = K / kXBlock;
  parallel_for(M, M * K >= (1 << 16) ? 1 : M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const T* xr = x + m * ldx;
#if defined(__AVX512F__)
      for (int64_t j = 0; j < nb; ++j) {
        const T* p = xr + j * kXBlock;
        quantize_block16x2(__m512(vec::load<DT>(p)), __m512(vec::load<DT>(p + 16)), q + m * K + j * kXBlock,
                           meta + (m * nb + j) * kMeta);
      }
      continue;
#endif
      for (int64_t j = 0; j < nb; ++j) {
        float v[kXBlock], amax = 0.f;
        for (int i = 0; i < kXBlock; ++i) {
          v[i] = vec::to_f32<DT>(xr[j * kXBlock + i]);
          amax = std::fmax(amax, std::fabs(v[i]));
        }
        const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int8_t* qr = q + m * K + j * kXBlock;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < kXBlock; ++i) {
          const int c = int(std::nearbyint(v[i] * inv));
          qr[i] = int8_t(c);
          (i < 16 ? s0 : s1) += c;
        }
        float* mt = meta + (m * nb + j) * kMeta;
        mt[0] = dx;
        mt[1] = dx * float(s0);
        mt[2] = dx * float(s1);
        mt[3] = dx * float(s0 + s1);
      }
    }
  });
}

// The activation sum that multiplies a sub-block's offset: the whole 32-block, or its half.
LLMK_ALWAYS_INLINE float offset_sum(const float* mt, int block, int64_t k0) {
  return block == kXBlock ? mt[3] : mt[1 + (k0 % kXBlock) / 16];
}

}  // namespace qact
LLMK_NS_END
