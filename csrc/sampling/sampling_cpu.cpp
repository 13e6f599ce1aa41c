// CPU kernels of the sampling ops: sorting-free rejection sampling with pivots (sample_rows) and
// exact pivot searches for renormalisation / masking (renorm_rows). The per-row algorithms are
// row_algo.h's (shared with the CUDA kernels), the passes row_engine_cpu.h's; this file loads rows.
#include <algorithm>
#include <cmath>

#include "sampling/row_engine_cpu.h"
#include "sampling/small_k_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

// Combines the load pass's per-block partials (stats of pivot 0 and max/argmax) in block order.
void combine_load(Row& r, Loaded& L) {
  Shared& s = r.shared();
  const int64_t nb = r.span.nblocks();
  auto& lm = r.low_mass_blocks();
  auto& lc = r.low_cnt_blocks();
  lm.resize(nb);
  lc.resize(nb);
  float best = -kInf;
  int64_t arg = 0;
  for (int64_t b = 0; b < nb; ++b) {
    L.mass += static_cast<double>(s.bmass[b]);
    L.cnt += s.bcnt[b];
    L.min_pos = std::min(L.min_pos, s.bmin[b]);
    lm[b] = s.bmass[b];
    lc[b] = s.bcnt[b];
    if (s.bmax[b] > best) {
      best = s.bmax[b];
      arg = s.barg[b];
    }
  }
  L.max_w = best;
  L.argmax = arg;
  L.degenerate = degenerate_mass(L.mass);
}

// Probabilities (or logits, for the top-k mask): fp32 rows are used in place, fp16/bf16 rows (and
// masked rows: disallowed weights read 0) are converted into the scratch row.
// dom_lo: the statistics are those of {w > dom_lo} (0: the positive weights).
template <DType DT>
Loaded load_probs(Row& r, const elem_t<DT>* x, int64_t V, float dom_lo = 0.0f, const int32_t* mask = nullptr) {
  Shared& s = r.shared();
  const bool copy = DT != DType::F32 || mask;
  const float* w = copy ? s.w.data() : reinterpret_cast<const float*>(x);
  r.span = Span{w, nullptr, V};
  const int64_t nb = r.span.nblocks();
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    if (mask) block_masked<DT>(x, lo, hi, mask, 0.0f, s.w.data());
    else if constexpr (DT != DType::F32) block_convert<DT>(x, lo, hi, s.w.data());
    store_stats_above(s, w, lo, hi, b, dom_lo);
    block_max_arg<DType::F32>(w, lo, hi, s.bmax[b], s.barg[b]);
  });
  Loaded L;
  combine_load(r, L);
  return L;
}

// What a caller of load_logits needs besides the weights: the probability path's statistics (a
// filtered draw), the block masses only (a plain draw: count and smallest weight stay 0 and inf),
// or nothing (softmax).
enum class Want { Stats, Mass, Weights };

// Logits, two passes. Pass 1, per block while it is in L1: the block's maximum m_b, then
// e = exp((x - m_b) / T) into the scratch row and the block's sum. Pass 2 scales each block to the
// softmax, w = e * c_b with c_b = exp((m_b - m) / T) / S (m the row's maximum, S the sum of the
// rescaled block sums), into `out` (default: the scratch row), with what `want` asks for. The row
// is read from memory once (the maximum first over the whole row cost a second read, from L2, and
// a third pass), and softmax_rows writes the same floats, so the draws from logits are the draws
// from its output whatever pivots the algorithm places. A masked row's pass 1 first writes its
// logits (-inf where disallowed) into the scratch row and continues there. Greedy rows need the
// maximum and its first index only.
template <DType DT>
Loaded load_logits(Row& r, const elem_t<DT>* x, int64_t V, float temperature, const int32_t* mask = nullptr,
                   Want want = Want::Stats, float* out = nullptr) {
  Shared& s = r.shared();
  const int64_t nb = (V + kBlock - 1) / kBlock;
  const float inv_t = 1.0f / temperature;
  const bool weights = !greedy_temperature(temperature);
  float* w = s.w.data();
  const int nt = r.team().nt;
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    // the block this thread reads next (past the row's end: the start of the next row, which is
    // the thread's next row when rows are contiguous)
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(x) + static_cast<uintptr_t>((b + nt) * kBlock) * sizeof(*x);
    float& mb = s.bmax[b];
    if (mask) block_masked<DT>(x, lo, hi, mask, -kInf, w);
    mb = mask ? block_max<DType::F32>(w, lo, hi) : block_max<DT>(x, lo, hi);
    if (!weights) return;
    if (!(mb > -kInf)) {  // nothing finite: weight 0 (and no -inf - -inf)
      std::fill(w + lo, w + hi, 0.0f);
      s.bmass[b] = 0.0f;
      return;
    }
    s.bmass[b] = mask ? block_exp_sum<DType::F32>(w, lo, hi, mb, inv_t, w, ahead)
                      : block_exp_sum<DT>(x, lo, hi, mb, inv_t, w, ahead);
  });
  Loaded L;
  float m = -kInf;
  int64_t mblock = -1;
  for (int64_t b = 0; b < nb; ++b)
    if (s.bmax[b] > m) {
      m = s.bmax[b];
      mblock = b;
    }
  if (mblock >= 0) {  // the first index of the maximum (NaN ignored), as the one-hot of greedy rows
    const int64_t lo = mblock * kBlock, hi = std::min(V, lo + kBlock);
    L.argmax = block_find<DT>(x, lo, hi, m, mask);  // (w holds exponentials by now)
  }
  if (logits_row_decided(m, temperature, L)) return L;
  const auto block_factor = [&](int64_t b) { return exp_nonpos((s.bmax[b] - m) * inv_t); };  // 0 for -inf
  double sum = 0.0;
  for (int64_t b = 0; b < nb; ++b) sum += static_cast<double>(s.bmass[b]) * static_cast<double>(block_factor(b));
  if (degenerate_mass(sum)) {
    L.degenerate = true;
    return L;
  }
  const float inv_s = static_cast<float>(1.0 / sum);
  if (!out) out = w;
  r.span = Span{out, nullptr, V};
  r.sync();
  r.for_blocks(nb, [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    const float c = block_factor(b) * inv_s;
    if (want == Want::Stats) {
      block_scale(w, lo, hi, c, out);
      store_positive_stats(s, out, lo, hi, b);  // the probability path's load pass, on the same floats
    } else if (want == Want::Mass) {
      s.bmass[b] = block_scale_mass(w, lo, hi, c, out);
      s.bcnt[b] = 0;
      s.bmin[b] = kInf;
    } else {
      block_scale(w, lo, hi, c, out);
    }
  });
  const int64_t arg = L.argmax;
  L = Loaded{};
  if (want != Want::Weights) combine_load(r, L);
  // the largest softmax weight, exactly: exp(0) * (exp(0) * inv_s); no other weight is above it
  L.max_w = inv_s;
  L.argmax = arg;
  return L;
}

// Rows that take the one-pass path of small_k_cpu.h: small k, top-p (if any) relative to the
// top-k set, no min-p, and a positive temperature for logits.
bool small_k_eligible(const RowFilter& f, int64_t V, float temperature) {
  return f.k > 0 && f.k <= kSmallK && 4 * f.k <= V && !f.has_min_p() && (!f.has_p() || f.k_first) &&
         !greedy_temperature(temperature) && std::isfinite(temperature);
}

template <typename T>
const T* row_ptr(const TensorView& x, int64_t r) {
  return reinterpret_cast<const T*>(x.bytes() + r * x.stride(0) * static_cast<int64_t>(x.elem_size()));
}
// Row r of an optional [rows, words] bitmask (null when absent).
const int32_t* mask_row(const TensorView* m, int64_t r) {
  return m ? m->ptr<const int32_t>() + r * m->stride(0) : nullptr;
}
template <typename T>
T* row_ptr_mut(const TensorView& x, int64_t r) {
  return reinterpret_cast<T*>(x.bytes() + r * x.stride(0) * static_cast<int64_t>(x.elem_size()));
}

// f(row, i, DTag<dtype>) for the rows [0, batch) of x's kernel (x: the input rows, for the dtype).
template <typename F>
void for_each_row(const TensorView& x, int64_t batch, F&& f) {
  dispatch_elem(x.dtype, [&](auto tag) {
    run_rows(batch, x.size(1), [&](const Team& t, Shared& s, int64_t i) {
      Row r(t, s);
      f(r, i, tag);
    });
  });
}

}  // namespace

void sample_rows(const SampleArgs& a) {
  const int64_t V = a.x.size(1);
  for_each_row(a.x, a.batch, [&](Row& r, int64_t i, auto tag) {
    constexpr DType DT = decltype(tag)::value;
    using T = elem_t<DT>;
    const int64_t src = a.indices ? index_of(*a.indices, i) : i;
    const T* x = row_ptr<T>(a.x, src);
    RowFilter f{param_i(a.top_k, i), static_cast<float>(param_f(a.top_p, i)),
                static_cast<float>(param_f(a.min_p, i)), a.k_first};
    const RowRng rng = RowRng::make(param_u64(a.seed, i), param_u64(a.offset, i), static_cast<uint32_t>(i));
    const float temp = a.is_logits ? static_cast<float>(param_f(a.temperature, i)) : 1.0f;
    const int32_t* mask = mask_row(a.bitmask, i);
    if (small_k_eligible(f, V, temp)) {
      // one pass by the team's leader (the result must not depend on the team size)
      Shared& s = r.shared();
      if (r.leader()) {
        int64_t tok = -1;
        s.fast_token = sample_small_k<DT>(x, V, a.is_logits, temp, f.k, f.top_p, rng, tok, mask) ? tok : -1;
      }
      r.sync();
      if (s.fast_token >= 0) {
        if (r.leader()) {
          write_index(a.out, i, s.fast_token);
          a.valid.ptr<bool>()[i] = true;
        }
        return;
      }
    }
    // a plain draw (no filter) reads the block masses only, on either path
    const bool plain = !(f.k > 0) && !f.has_p() && !f.has_min_p();
    Loaded L = a.is_logits ? load_logits<DT>(r, x, V, temp, mask, plain ? Want::Mass : Want::Stats)
                           : load_probs<DT>(r, x, V, 0.0f, mask);
    const RowResult res = sample_loaded(r, L, f, rng);
    if (r.leader()) {
      write_index(a.out, i, res.token);
      a.valid.ptr<bool>()[i] = res.valid;
    }
  });
}

void softmax_rows(const SoftmaxArgs& a) {
  const int64_t V = a.x.size(1);
  for_each_row(a.x, a.x.size(0), [&](Row& r, int64_t i, auto tag) {
    constexpr DType DT = decltype(tag)::value;
    float* out = row_ptr_mut<float>(a.out, i);
    const Loaded L = load_logits<DT>(r, row_ptr<elem_t<DT>>(a.x, i), V, static_cast<float>(param_f(a.temperature, i)),
                                     mask_row(a.bitmask, i), Want::Weights, out);
    if (!L.degenerate && !L.done) return;  // pass 2 wrote the weights
    r.sync();
    r.for_blocks((V + kBlock - 1) / kBlock, [&](int64_t b) {
      for (int64_t j = b * kBlock, e = std::min(V, (b + 1) * kBlock); j < e; ++j)
        out[j] = L.degenerate ? 0.0f : (j == L.argmax ? 1.0f : 0.0f);
    });
  });
}

void renorm_rows(const RenormArgs& a) {
  const int64_t V = a.x.size(1);
  for_each_row(a.x, a.x.size(0), [&](Row& r, int64_t i, auto tag) {
    constexpr DType DT = decltype(tag)::value;
    using T = elem_t<DT>;
    const T* x = row_ptr<T>(a.x, i);
    T* out = row_ptr_mut<T>(a.out, i);
    const int64_t nb = (V + kBlock - 1) / kBlock;
    const int64_t k = param_i(a.param, i);
    if (a.kind == RenormKind::MaskLogitsTopK) {
      // Exact top-k threshold on the logits themselves (signed; -inf and NaN never counted).
      const Loaded L = load_probs<DT>(r, x, V, -kInf);
      const float lo = mask_threshold(r, k, L.cnt, L.min_pos, L.max_w);
      r.sync();
      r.for_blocks(nb, [&](int64_t b) {
        for (int64_t j = b * kBlock, e = std::min(V, (b + 1) * kBlock); j < e; ++j) {
          out[j] = vec::to_f32<DT>(x[j]) > lo ? x[j] : vec::from_f32<DT>(-kInf);
        }
      });
      return;
    }
    const Loaded L = load_probs<DT>(r, x, V);
    const float* w0 = r.span.w;  // the row's weights, before any compaction
    const RenormPlan plan = renorm_plan(r, L, a.kind, k, static_cast<float>(param_f(a.param, i)),
                                        static_cast<uint32_t>(i));
    r.sync();
    r.for_blocks(nb, [&](int64_t b) {
      for (int64_t j = b * kBlock, e = std::min(V, (b + 1) * kBlock); j < e; ++j)
        out[j] = vec::from_f32<DT>(renorm_value(w0[j], plan.lo, plan.inv));
    });
  });
}

LLMK_NS_END
