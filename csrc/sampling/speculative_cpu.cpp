// CPU kernel of chain speculative sampling: the per-request algorithm is row_algo.h's spec_row
// (shared with the CUDA kernel); this file supplies its inputs and the residual passes.
#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

const float* row3(const TensorView& t, int64_t b, int64_t i) {
  return t.ptr<const float>() + b * t.stride(0) + i * t.stride(1);
}

// Request b of a chain_speculative call as row_algo.h's speculative row. With a token bitmask, the
// target at position i is p masked and renormalised: p' = p * allowed / Z_i (Z_i: the allowed mass).
struct CpuSpecRow {
  Row& r;
  const SpecArgs& a;
  int64_t b, n, V;
  int64_t scaled_pos = -1;  // the position whose 1 / Z is in inv_z
  float inv_z = 1.0f;

  int64_t id(int64_t i) const { return index_of(a.draft_ids, b * n + i); }
  float q(int64_t i, int64_t d) const { return a.draft_probs ? row3(*a.draft_probs, b, i)[d] : 1.0f; }
  const int32_t* mask(int64_t i) const {
    return a.bitmask ? a.bitmask->ptr<const int32_t>() + b * a.bitmask->stride(0) + i * a.bitmask->stride(1) : nullptr;
  }
  float p(int64_t i, int64_t d) {
    const float pv = row3(a.target_probs, b, i)[d];
    if (!a.bitmask) return pv;
    return token_allowed(mask(i), d) ? pv * scale(i) : 0.0f;
  }
  // 1 / Z_i, computed by a pass over position i (per-block sums combined in block order: the same
  // value on every thread of the team); 0 when nothing allowed has mass.
  float scale(int64_t i) {
    if (scaled_pos == i) return inv_z;
    Shared& s = r.shared();
    const float* pr = row3(a.target_probs, b, i);
    const int32_t* mk = mask(i);
    const int64_t nb = (V + kBlock - 1) / kBlock;
    r.sync();
    r.for_blocks(nb, [&](int64_t blk) {
      float acc = 0.0f;
      for (int64_t j = blk * kBlock, e = std::min(V, (blk + 1) * kBlock); j < e; ++j)
        if (pr[j] > 0.0f && token_allowed(mk, j)) acc += pr[j];
      s.bmass[blk] = acc;
    });
    double z = 0.0;
    for (int64_t blk = 0; blk < nb; ++blk) z += s.bmass[blk];
    scaled_pos = i;
    inv_z = z > 0.0 && z != static_cast<double>(INFINITY) ? static_cast<float>(1.0 / z) : 0.0f;
    return inv_z;
  }
  // The final token when no weight is left: token 0 as before, -1 when a bitmask allows nothing.
  int64_t empty_token() const { return a.bitmask ? -1 : 0; }

  // Writes the weights of `mode` at position m into the scratch row; returns their positive mass.
  double residual_mass(int64_t m, ResidualMode mode) {
    Shared& s = r.shared();
    float* w = s.w.data();
    const float* pr = row3(a.target_probs, b, m);
    const float* qr = a.draft_probs ? row3(*a.draft_probs, b, m) : nullptr;
    const int64_t tok = mode == ResidualMode::OneHot ? id(m) : -1;
    const int64_t nb = (V + kBlock - 1) / kBlock;
    const int32_t* mk = mask(m);
    const float sc = mk ? scale(m) : 1.0f;
    r.span = Span{w, nullptr, V};
    r.sync();
    r.for_blocks(nb, [&](int64_t blk) {
      const int64_t lo = blk * kBlock, hi = std::min(V, lo + kBlock);
      for (int64_t j = lo; j < hi; ++j) {
        const float pj = !mk ? pr[j] : token_allowed(mk, j) ? pr[j] * sc : 0.0f;
        if (mode == ResidualMode::Dense) w[j] = spec_residual(pj, qr[j]);
        else w[j] = j == tok ? spec_residual(pj, 1.0f) : pj;
      }
      store_positive_stats(s, w, lo, hi, blk);
    });
    double total = 0.0;
    auto& lm = r.low_mass_blocks();
    lm.resize(nb);
    for (int64_t blk = 0; blk < nb; ++blk) {
      lm[blk] = s.bmass[blk];
      total += lm[blk];
    }
    return total;
  }
  int64_t residual_select(int64_t, ResidualMode, double target) { return r.select_pos(0.0f, target); }
};

}  // namespace

void chain_speculative(const SpecArgs& a) {
  const int64_t B = a.target_probs.size(0), n = a.target_probs.size(1) - 1, V = a.target_probs.size(2);
  run_rows(B, V, [&](const Team& t, Shared& s, int64_t b) {
    Row r(t, s);
    CpuSpecRow sr{r, a, b, n, V};
    const RowRng rng = RowRng::make(param_u64(a.seed, b), param_u64(a.offset, b), static_cast<uint32_t>(b));
    const SpecResult res = spec_row(sr, n, a.draft_probs != nullptr, rng);
    if (r.leader()) {
      spec_write(sr, a.out.ptr<int32_t>() + b * (n + 1), n, res);
      auto add = [&](const TensorView& c, int64_t v) {
        if (c.dtype == DType::I64) c.ptr<int64_t>()[b] += v;
        else c.ptr<int32_t>()[b] += static_cast<int32_t>(v);
      };
      add(a.accepted, res.accepted);
      add(a.emitted, res.emitted);
    }
  });
}

LLMK_NS_END
