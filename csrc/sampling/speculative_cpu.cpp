// CPU kernel of chain speculative sampling: per request, accept draft tokens while
// u * q(token) < p(token); at the first rejection draw from normalised relu(p - q), otherwise draw
// the bonus token from the last target row. One-hot drafts (no draft_probs): q = 1 at the token.
#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

const float* row3(const TensorView& t, int64_t b, int64_t i) {
  return t.ptr<const float>() + b * t.stride(0) + i * t.stride(1);
}

// Draws from max(p - q, 0) (q null: from p; q_token >= 0: q is one-hot at q_token); falls back to p
// when the residual has no mass (p == q up to rounding).
int64_t draw_residual(Row& r, const float* p, const float* q, int64_t q_token, int64_t V, float u) {
  Shared& s = r.shared();
  float* w = s.w.data();
  const int64_t nb = (V + kBlock - 1) / kBlock;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool plain = attempt == 1 || (!q && q_token < 0);
    r.span = Span{w, nullptr, V};
    r.sync();
    r.for_blocks(nb, [&](int64_t b) {
      const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
      if (plain) {
        for (int64_t j = lo; j < hi; ++j) w[j] = p[j];
      } else if (q) {
        for (int64_t j = lo; j < hi; ++j) w[j] = spec_residual(p[j], q[j]);
      } else {
        for (int64_t j = lo; j < hi; ++j) w[j] = j == q_token ? spec_residual(p[j], 1.0f) : p[j];
      }
      store_positive_stats(s, w, lo, hi, b);
    });
    double total = 0.0;
    auto& lm = r.low_mass_blocks();
    lm.resize(nb);
    for (int64_t b = 0; b < nb; ++b) {
      lm[b] = s.bmass[b];
      total += lm[b];
    }
    if (total > 0.0 && std::isfinite(total)) {
      const int64_t pos = r.select(0.0f, static_cast<double>(u) * total);
      if (pos >= 0) return pos;
    }
    if (plain) break;
  }
  return 0;  // no positive mass anywhere: documented as token 0
}

}  // namespace

void chain_speculative(const SpecArgs& a) {
  const int64_t B = a.target_probs.size(0), n = a.target_probs.size(1) - 1, V = a.target_probs.size(2);
  run_rows(B, V, [&](const Team& t, Shared& s, int64_t b) {
    Row r(t, s);
    const RowRng rng = RowRng::make(param_u64(a.seed, b), param_u64(a.offset, b), static_cast<uint32_t>(b));
    int64_t indep = 0, first_reject = -1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t d = index_of(a.draft_ids, b * n + i);
      const float q = a.draft_probs ? row3(*a.draft_probs, b, i)[d] : 1.0f;
      const float p = row3(a.target_probs, b, i)[d];
      const bool ok = spec_accepts(rng.uniform(static_cast<uint32_t>(i)), q, p);
      indep += ok ? 1 : 0;
      if (!ok && first_reject < 0) first_reject = i;
    }
    const int64_t m = first_reject < 0 ? n : first_reject;  // emitted draft tokens
    const float u = rng.uniform(spec_final_draw(n));
    int64_t last;
    if (first_reject < 0) {
      last = draw_residual(r, row3(a.target_probs, b, n), nullptr, -1, V, u);
    } else {
      const int64_t d = index_of(a.draft_ids, b * n + m);
      last = a.draft_probs ? draw_residual(r, row3(a.target_probs, b, m), row3(*a.draft_probs, b, m), -1, V, u)
                           : draw_residual(r, row3(a.target_probs, b, m), nullptr, d, V, u);
    }
    if (r.leader()) {
      int32_t* o = a.out.ptr<int32_t>() + b * (n + 1);
      for (int64_t i = 0; i < m; ++i) o[i] = static_cast<int32_t>(index_of(a.draft_ids, b * n + i));
      o[m] = static_cast<int32_t>(last);
      for (int64_t i = m + 1; i <= n; ++i) o[i] = -1;
      auto add = [&](const TensorView& c, int64_t v) {
        if (c.dtype == DType::I64) c.ptr<int64_t>()[b] += v;
        else c.ptr<int32_t>()[b] += static_cast<int32_t>(v);
      };
      add(a.accepted, indep);
      add(a.emitted, m);
    }
  });
}

LLMK_NS_END
