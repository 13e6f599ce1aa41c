#include "sampling/sampling_checks.h"

#include <climits>
#include <cmath>

namespace llmk {

namespace {

const char* range_error(ParamKind kind, double v, int64_t vocab) {
  switch (kind) {
    case ParamKind::Temperature: return (v >= 0.0 && std::isfinite(v)) ? nullptr : "a finite value >= 0 (0 = greedy)";
    case ParamKind::TopK: return (v >= 0 && v <= static_cast<double>(vocab)) ? nullptr : "in [0, vocab_size] (0 = no top-k)";
    case ParamKind::TopP: return (v >= 0.0 && v <= 1.0) ? nullptr : "in [0, 1] (1 = no top-p, 0 = the most likely tokens)";
    case ParamKind::MinP: return (v >= 0.0 && v <= 1.0) ? nullptr : "in [0, 1] (0 = no min-p)";
    case ParamKind::Repetition: return (v > 0.0 && std::isfinite(v)) ? nullptr : "a finite value > 0 (1 = no penalty)";
    case ParamKind::Penalty: return std::isfinite(v) ? nullptr : "a finite value (0 = no penalty)";
  }
  return nullptr;
}

double value_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<const float>()[i];
    case DType::I32: return t.ptr<const int32_t>()[i];
    case DType::I64: return static_cast<double>(t.ptr<const int64_t>()[i]);
    default: return 0.0;
  }
}

}  // namespace

RowParam row_param(const std::optional<TensorView>& arr, double val, const char* name, ParamKind kind,
                   int64_t batch, int64_t vocab, const TensorView& like) {
  RowParam p;
  p.val = val;
  // With no rows there is no vocabulary to bound top_k by (a [0, 0] input is a valid empty call).
  if (batch == 0) vocab = INT64_MAX;
  if (!arr) {
    const char* bad = range_error(kind, val, vocab);
    LLMK_CHECK(!bad, ValueError, name, ": expected ", bad, ", got ", val);
    return p;
  }
  const TensorView& t = *arr;
  check_ndim(t, name, 1, "[batch_size] (one value per output row)");
  LLMK_CHECK(t.size(0) == batch || t.size(0) == 1, ValueError, name, ": expected ", batch,
             " values (one per output row) or 1, got ", t.size(0));
  if (kind == ParamKind::TopK) check_index(t, name);
  else check_dtype(t, name, DType::F32);
  check_same_device(like, "probs/logits", t, name);
  check_contiguous(t, name);
  if (host_readable(t)) {
    for (int64_t i = 0; i < t.size(0); ++i) {
      const double v = value_at(t, i);
      const char* bad = range_error(kind, v, vocab);
      LLMK_CHECK(!bad, ValueError, name, ": entry ", i, " is ", v, ", expected ", bad);
    }
  }
  p.arr = &t;
  return p;
}

RowParam seed_param(const std::optional<TensorView>& arr, int64_t val, const char* name, int64_t batch,
                    const TensorView& like) {
  RowParam p;
  p.uval = static_cast<uint64_t>(val);
  if (!arr) return p;
  const TensorView& t = *arr;
  check_ndim(t, name, 1, "[1] or [batch_size]");
  LLMK_CHECK(t.size(0) == batch || t.size(0) == 1, ValueError, name, ": expected 1 or ", batch,
             " values, got ", t.size(0));
  check_dtype(t, name, DType::I64);
  check_same_device(like, "probs/logits", t, name);
  check_contiguous(t, name);
  p.arr = &t;
  return p;
}

void check_bitmask(const TensorView& t, const char* name, std::initializer_list<int64_t> lead, int64_t vocab,
                   const TensorView& like, const char* layout) {
  check_dtype(t, name, DType::I32);
  check_ndim(t, name, static_cast<int>(lead.size()) + 1, layout);
  int d = 0;
  for (int64_t n : lead) {
    LLMK_CHECK(t.size(d) == n, ValueError, name, ": expected shape ", layout, ", dim ", d, " is ", t.size(d),
               " instead of ", n);
    ++d;
  }
  const int64_t words = (vocab + 31) / 32;
  LLMK_CHECK(t.size(d) >= words, ValueError, name, ": ", t.size(d), " words of 32 tokens do not cover vocab_size ",
             vocab, " (need at least ", words, "; pad with zero words to disallow the padding tokens)");
  check_same_device(like, "probs/logits", t, name);
  check_last_dim_contiguous(t, name);
}

void check_row_vector(const TensorView& t, const char* name, int64_t batch, const TensorView& like,
                      bool index_dtype) {
  check_shape(t, name, {batch}, "[batch_size]");
  if (index_dtype) check_index(t, name);
  else check_dtype(t, name, DType::Bool);
  check_same_device(like, "probs/logits", t, name);
  check_contiguous(t, name);
}

}  // namespace llmk
