// CPU kernel of apply_penalties. Dense inputs (counts / prompt mask) take one pass over the row;
// token-id inputs touch only the listed tokens, through per-thread scratch counters that are reset
// after each row.
#include <vector>

#include "sampling/row_engine_cpu.h"

LLMK_NS_BEGIN
namespace {

using namespace rowcpu;

struct Scratch {
  std::vector<int32_t> cnt;   // output occurrences of each token (id inputs)
  std::vector<uint8_t> seen;  // bit 0: in the prompt (id input), bit 1: already penalised
  void ensure(int64_t V) {
    if (static_cast<int64_t>(cnt.size()) < V) {
      cnt.assign(V, 0);
      seen.assign(V, 0);
    }
  }
};

template <DType DT, typename T = elem_t<DT>>
void penalise_row(const PenaltyArgs& a, int64_t b, Scratch& s) {
  const int64_t V = a.logits.size(1);
  T* x = reinterpret_cast<T*>(a.logits.bytes() + b * a.logits.stride(0) * static_cast<int64_t>(a.logits.elem_size()));
  const float rep = static_cast<float>(param_f(a.repetition, b));
  const float freq = static_cast<float>(param_f(a.frequency, b));
  const float pres = static_cast<float>(param_f(a.presence, b));
  auto ids_of = [&](const TensorView* t, auto&& f) {
    if (!t) return;
    const int64_t L = t->size(1);
    for (int64_t j = 0; j < L; ++j) {
      const int64_t id = index_of(*t, b * L + j);
      if (id >= 0 && id < a.logits.size(1)) f(id);  // -1 / vocab_size: padding
    }
  };
  ids_of(a.output_ids, [&](int64_t id) { ++s.cnt[id]; });
  ids_of(a.prompt_ids, [&](int64_t id) { s.seen[id] |= 1; });
  const bool dense = a.output_counts || a.prompt_mask;
  if (dense) {
    const bool* pm = a.prompt_mask ? a.prompt_mask->ptr<const bool>() + b * V : nullptr;
    for (int64_t j = 0; j < V; ++j) {
      const int64_t c = a.output_counts ? index_of(*a.output_counts, b * V + j) : s.cnt[j];
      const bool in_prompt = pm ? pm[j] : (s.seen[j] & 1);
      if (c == 0 && !in_prompt) continue;
      x[j] = vec::from_f32<DT>(apply_penalty(vec::to_f32<DT>(x[j]), true, c, rep, freq, pres));
    }
  } else {
    auto touch = [&](int64_t id) {
      if (s.seen[id] & 2) return;
      s.seen[id] |= 2;
      x[id] = vec::from_f32<DT>(apply_penalty(vec::to_f32<DT>(x[id]), true, s.cnt[id], rep, freq, pres));
    };
    ids_of(a.output_ids, touch);
    ids_of(a.prompt_ids, touch);
  }
  // reset the scratch entries this row used
  ids_of(a.output_ids, [&](int64_t id) { s.cnt[id] = 0; s.seen[id] = 0; });
  ids_of(a.prompt_ids, [&](int64_t id) { s.seen[id] = 0; });
}

}  // namespace

void apply_penalties(const PenaltyArgs& a) {
  const int64_t B = a.logits.size(0), V = a.logits.size(1);
  parallel_for(B, 1, [&](int64_t lo, int64_t hi) {
    static thread_local Scratch s;
    s.ensure(V);
    for (int64_t b = lo; b < hi; ++b) {
      dispatch_elem(a.logits.dtype, [&](auto tag) { penalise_row<decltype(tag)::value>(a, b, s); });
    }
  });
}

LLMK_NS_END
