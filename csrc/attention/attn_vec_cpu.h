// The attention kernels' name for the CPU numeric library (common/vec_cpu.h), and the online
// softmax row step of the decode kernels.
#pragma once
#include <algorithm>
#include <cmath>

#include "attention/attention_math.h"
#include "common/exp_cpu.h"
#include "common/vec_cpu.h"

LLMK_NS_BEGIN
namespace attn {
using namespace vec;  // NOLINT: attn::VL, attn::load<T>, ... as before the library moved

#if defined(__AVX512F__)
// 32 bf16 values, a in the low half and b in the high, as pair words (a[i], b[i]): one word shuffle.
LLMK_ALWAYS_INLINE __m512i bf16_halves_to_pair_words(__m512i ab) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, ab);
}

// 16 bf16 values a and 16 b as pair words (a[i] in the low half of word i, b[i] in the high): the
// P operand of the bf16 kernels' P.V, whichever instruction rounded a and b.
LLMK_ALWAYS_INLINE __m512i bf16_pair_words(__m256i a, __m256i b) {
  // a and b side by side, then one word shuffle interleaves them (two instructions, not four)
  return bf16_halves_to_pair_words(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

// Two fp32 vectors as bf16 pair words (a low, b high), both rounded to nearest even by one
// vcvtne2ps2bf16 (AVX512_BF16 CPUs only; like vcvtneps2bf16 it flushes denormal inputs to zero).
LLMK_ALWAYS_INLINE __m512i bf16_pairs_cvt(__m512 a, __m512 b) {
  __m512i halves;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(halves) : "v"(b), "v"(a));  // a to the low half
  return bf16_halves_to_pair_words(halves);
}

// unpack{lo,hi}_epi16 of two rows (and vdpbf16ps on such pairs) leave the 32-bit results of a
// 32-wide block as lo = {0-3, 8-11, 16-19, 24-27}, hi = {4-7, 12-15, 20-23, 28-31}, a group per
// 128-bit lane: first / second get 0-15 / 16-31 back in order.
LLMK_ALWAYS_INLINE void restore_unpack_order(__m512i lo, __m512i hi, __m512i& first, __m512i& second) {
  const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  first = _mm512_permutex2var_epi32(lo, i0, hi);
  second = _mm512_permutex2var_epi32(lo, i1, hi);
}
#endif

// One row of the decode kernels' online softmax over a tile of nk keys from key j0. srow holds
// the scores (storage up to nk rounded up to VL); softcap / ALiBi are applied, keys outside
// [lo, hi) and the padding lanes masked (full: every key of the tile is visible, so only the
// padding is), then the scores are replaced by exp(s - new max) and (m, l) updated. Returns the
// factor the row's running output must be scaled by.
LLMK_ALWAYS_INLINE float softmax_row_tile(float* srow, int nk, int j0, float lo, float hi, float pos,
                                          float slope, float cap, bool alibi, bool full, float& m,
                                          float& l) {
  vf iota;
  for (int i = 0; i < VL; ++i) iota[i] = float(i);
  lo = std::max(lo, float(j0));
  hi = std::min(hi, float(j0 + nk));
  const int nkp = (nk + VL - 1) / VL * VL;
  vf mt = splat(-INFINITY);
  for (int jb = 0; jb < nkp; jb += VL) {
    vf s = loadu(srow + jb);
    if (cap > 0.f) s = cap * vtanh(s * (1.f / cap));
    const vf jf = iota + float(j0 + jb);
    if (alibi) {
      const vf dist = splat(pos) - jf;
      s -= splat(slope) * (dist < 0.f ? -dist : dist);
    }
    if (!full || jb + VL > nk) s = ((jf >= lo) & (jf < hi)) ? s : splat(-INFINITY);
    storeu(srow + jb, s);
    mt = vmax(mt, s);
  }
  SoftmaxState st{m, l};
  const float alpha = attn_softmax_rescale(st, hmax(mt));
  const vf base = splat(attn_exp_base(st.m));
  vf sum = splat(0.f);
  for (int jb = 0; jb < nkp; jb += VL) {
    const vf e = exp_nonpos(loadu(srow + jb) - base);  // <= 0: base is the running maximum
    storeu(srow + jb, e);
    sum += e;
  }
  m = st.m;
  l = st.l + hsum(sum);
  return alpha;
}
}  // namespace attn
LLMK_NS_END
