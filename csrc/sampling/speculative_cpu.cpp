// CPU kernel of chain speculative sampling: the per-request algorithm is row_algo.h's spec_row
// (shared with the CUDA kernel); this file supplies its inputs and the residual passes.
#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

const float* row3(const TensorView& t, int64_t b, int64_t i) {
  return t.ptr<const float>() + b * t.stride(0) + i * t.stride(1);
}

// Request b of a chain_speculative call as row_algo.h's speculative row.
struct CpuSpecRow {
  Row& r;
  const SpecArgs& a;
  int64_t b, n, V;

  int64_t id(int64_t i) const { return index_of(a.draft_ids, b * n + i); }
  float q(int64_t i, int64_t d) const { return a.draft_probs ? row3(*a.draft_probs, b, i)[d] : 1.0f; }
  float p(int64_t i, int64_t d) const { return row3(a.target_probs, b, i)[d]; }

  // Writes the weights of `mode` at position m into the scratch row; returns their positive mass.
  double residual_mass(int64_t m, ResidualMode mode) {
    Shared& s = r.shared();
    float* w = s.w.data();
    const float* pr = row3(a.target_probs, b, m);
    const float* qr = a.draft_probs ? row3(*a.draft_probs, b, m) : nullptr;
    const int64_t tok = mode == ResidualMode::OneHot ? id(m) : -1;
    const int64_t nb = (V + kBlock - 1) / kBlock;
    r.span = Span{w, nullptr, V};
    r.sync();
    r.for_blocks(nb, [&](int64_t blk) {
      const int64_t lo = blk * kBlock, hi = std::min(V, lo + kBlock);
      for (int64_t j = lo; j < hi; ++j) {
        if (mode == ResidualMode::Dense) w[j] = spec_residual(pr[j], qr[j]);
        else w[j] = j == tok ? spec_residual(pr[j], 1.0f) : pr[j];
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
