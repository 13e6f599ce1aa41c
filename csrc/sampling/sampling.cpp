// Fronts of the sampling and renormalisation ops: argument checks, then backend dispatch.
#include "sampling/sampling.h"

#include "sampling/sampling_checks.h"

namespace llmk {

namespace {

void check_rows(const TensorView& x, const char* name) {
  check_ndim(x, name, 2, "[batch_size, vocab_size]");
  check_float(x, name);
  check_last_dim_contiguous(x, name);
  LLMK_CHECK(x.size(1) >= 1 || x.size(0) == 0, ValueError, name, ": vocab_size must be >= 1, got shape ",
             shape_str(x));
  LLMK_CHECK(x.size(1) < (int64_t(1) << 31), ValueError, name, ": vocab_size must be < 2^31, got ", x.size(1));
}

}  // namespace

void sample(TensorView x, bool is_logits, std::optional<TensorView> indices,
            std::optional<TensorView> temperature_arr, double temperature_val,
            std::optional<TensorView> top_k_arr, int64_t top_k_val,
            std::optional<TensorView> top_p_arr, double top_p_val,
            std::optional<TensorView> min_p_arr, double min_p_val, const std::string& filter_apply_order,
            std::optional<TensorView> seed_arr, int64_t seed_val, std::optional<TensorView> offset_arr,
            int64_t offset_val, std::optional<TensorView> token_bitmask, TensorView out, TensorView valid,
            int64_t stream) {
  const char* xn = is_logits ? "logits" : "probs";
  check_rows(x, xn);
  const int64_t rows = x.size(0), vocab = x.size(1);
  int64_t batch = rows;
  if (indices) {
    check_ndim(*indices, "indices", 1, "[batch_size]");
    check_index(*indices, "indices");
    check_same_device(x, xn, *indices, "indices");
    check_contiguous(*indices, "indices");
    batch = indices->size(0);
    check_index_range(*indices, "indices", 0, rows, str_cat("rows of ", xn).c_str());
  }
  LLMK_CHECK(filter_apply_order == "top_k_first" || filter_apply_order == "joint", ValueError,
             "filter_apply_order: expected 'top_k_first' or 'joint', got '", filter_apply_order, "'");
  SampleArgs a;
  a.x = x;
  a.is_logits = is_logits;
  a.indices = indices ? &*indices : nullptr;
  a.batch = batch;
  a.temperature = row_param(temperature_arr, temperature_val, "temperature", ParamKind::Temperature, batch, vocab, x);
  a.top_k = row_param(top_k_arr, static_cast<double>(top_k_val), "top_k", ParamKind::TopK, batch, vocab, x);
  a.top_p = row_param(top_p_arr, top_p_val, "top_p", ParamKind::TopP, batch, vocab, x);
  a.min_p = row_param(min_p_arr, min_p_val, "min_p", ParamKind::MinP, batch, vocab, x);
  a.k_first = filter_apply_order == "top_k_first";
  a.seed = seed_param(seed_arr, seed_val, "seed", batch, x);
  a.offset = seed_param(offset_arr, offset_val, "offset", batch, x);
  if (token_bitmask) {
    // one mask row per output row (with indices: the output's, not the input row's)
    check_bitmask(*token_bitmask, "token_bitmask", {batch}, vocab, x, "[batch_size, ceil(vocab_size / 32)]");
    a.bitmask = &*token_bitmask;
  }
  check_row_vector(out, "out", batch, x, true);
  check_row_vector(valid, "valid", batch, x, false);
  a.out = out;
  a.valid = valid;
  a.stream = stream;
  if (batch == 0) return;
  LLMK_RUN(x, sample_rows, a);
}

void renorm(TensorView x, TensorView out, const std::string& kind, std::optional<TensorView> arr,
            double val, int64_t stream) {
  RenormArgs a;
  const char* xn = "probs";
  if (kind == "top_k") {
    a.kind = RenormKind::TopK;
  } else if (kind == "top_p") {
    a.kind = RenormKind::TopP;
  } else if (kind == "mask_logits") {
    a.kind = RenormKind::MaskLogitsTopK;
    xn = "logits";
  } else {
    throw ValueError(str_cat("kind: expected 'top_k', 'top_p' or 'mask_logits', got '", kind, "'"));
  }
  check_rows(x, xn);
  check_ndim(out, "out", 2, "[batch_size, vocab_size]");
  LLMK_CHECK(out.size(0) == x.size(0) && out.size(1) == x.size(1), ValueError, "out: shape ",
             shape_str(out), " does not match ", xn, " ", shape_str(x));
  check_same_dtype(x, xn, out, "out");
  check_same_device(x, xn, out, "out");
  check_last_dim_contiguous(out, "out");
  const int64_t batch = x.size(0), vocab = x.size(1);
  a.x = x;
  a.out = out;
  if (a.kind == RenormKind::TopP) {
    a.param = row_param(arr, val, "top_p", ParamKind::TopP, batch, vocab, x);
  } else {
    a.param = row_param(arr, val, "top_k", ParamKind::TopK, batch, vocab, x);
  }
  a.stream = stream;
  if (batch == 0) return;
  LLMK_RUN(x, renorm_rows, a);
}

void softmax(TensorView x, TensorView out, std::optional<TensorView> temperature_arr, double temperature_val,
             std::optional<TensorView> token_bitmask, int64_t stream) {
  check_rows(x, "logits");
  check_shape(out, "out", {x.size(0), x.size(1)}, "[batch_size, vocab_size]");
  check_dtype(out, "out", DType::F32);
  check_same_device(x, "logits", out, "out");
  check_last_dim_contiguous(out, "out");
  SoftmaxArgs a;
  a.x = x;
  a.out = out;
  a.temperature = row_param(temperature_arr, temperature_val, "temperature", ParamKind::Temperature, x.size(0),
                            x.size(1), x);
  if (token_bitmask) {
    check_bitmask(*token_bitmask, "token_bitmask", {x.size(0)}, x.size(1), x, "[batch_size, ceil(vocab_size / 32)]");
    a.bitmask = &*token_bitmask;
  }
  a.stream = stream;
  if (x.size(0) == 0 || x.size(1) == 0) return;
  LLMK_RUN(x, softmax_rows, a);
}

}  // namespace llmk
