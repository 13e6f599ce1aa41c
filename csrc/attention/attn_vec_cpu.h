// The attention kernels' name for the CPU numeric library (common/vec_cpu.h), and the online
// softmax row step of the decode kernels.
#pragma once
#include <algorithm>
#include <cmath>

#include "attention/attention_math.h"
#include "common/vec_cpu.h"

LLMK_NS_BEGIN
namespace attn {
using namespace vec;  // NOLINT: attn::VL, attn::load<T>, ... as before the library moved

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
    const vf e = vexp(loadu(srow + jb) - base);
    storeu(srow + jb, e);
    sum += e;
  }
  m = st.m;
  l = st.l + hsum(sum);
  return alpha;
}
}  // namespace attn
LLMK_NS_END
