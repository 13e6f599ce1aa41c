// Front of apply_penalties (vLLM semantics): checks, then dispatch.
#include "sampling/sampling.h"
#include "sampling/sampling_checks.h"

namespace llmk {

namespace {

void check_side(const std::optional<TensorView>& t, const char* name, const TensorView& logits, bool dense,
                DType dense_dtype_or_other) {
  if (!t) return;
  const int64_t b = logits.size(0), vocab = logits.size(1);
  if (dense) {
    check_shape(*t, name, {b, vocab}, "[batch_size, vocab_size] (from logits)");
    if (dense_dtype_or_other == DType::Bool) check_dtype(*t, name, DType::Bool);
    else check_index(*t, name);
  } else {
    check_ndim(*t, name, 2, "[batch_size, max_len] (token ids, -1 = padding)");
    check_dim(*t, name, 0, b, "batch_size, from logits");
    check_index(*t, name);
    check_index_range(*t, name, 0, vocab + 1, "token ids (-1 or vocab_size = padding)", /*allow_minus_one=*/true);
  }
  check_same_device(logits, "logits", *t, name);
  check_contiguous(*t, name);
}

}  // namespace

void apply_penalties(TensorView logits, std::optional<TensorView> output_token_counts,
                     std::optional<TensorView> output_token_ids, std::optional<TensorView> prompt_mask,
                     std::optional<TensorView> prompt_token_ids, std::optional<TensorView> repetition_arr,
                     double repetition_val, std::optional<TensorView> frequency_arr, double frequency_val,
                     std::optional<TensorView> presence_arr, double presence_val, int64_t stream) {
  check_ndim(logits, "logits", 2, "[batch_size, vocab_size]");
  check_float(logits, "logits");
  check_last_dim_contiguous(logits, "logits");
  LLMK_CHECK(!(output_token_counts && output_token_ids), ValueError,
             "output_token_ids: give either output_token_counts or output_token_ids, not both");
  LLMK_CHECK(!(prompt_mask && prompt_token_ids), ValueError,
             "prompt_token_ids: give either prompt_mask or prompt_token_ids, not both");
  check_side(output_token_counts, "output_token_counts", logits, true, DType::I64);
  check_side(output_token_ids, "output_token_ids", logits, false, DType::I64);
  check_side(prompt_mask, "prompt_mask", logits, true, DType::Bool);
  check_side(prompt_token_ids, "prompt_token_ids", logits, false, DType::I64);
  const int64_t b = logits.size(0), vocab = logits.size(1);
  PenaltyArgs a;
  a.logits = logits;
  a.output_counts = output_token_counts ? &*output_token_counts : nullptr;
  a.output_ids = output_token_ids ? &*output_token_ids : nullptr;
  a.prompt_mask = prompt_mask ? &*prompt_mask : nullptr;
  a.prompt_ids = prompt_token_ids ? &*prompt_token_ids : nullptr;
  a.repetition = row_param(repetition_arr, repetition_val, "repetition_penalties", ParamKind::Repetition, b, vocab, logits);
  a.frequency = row_param(frequency_arr, frequency_val, "frequency_penalties", ParamKind::Penalty, b, vocab, logits);
  a.presence = row_param(presence_arr, presence_val, "presence_penalties", ParamKind::Penalty, b, vocab, logits);
  a.stream = stream;
  if (b == 0 || vocab == 0) return;
  LLMK_RUN(logits, apply_penalties, a);
}

}  // namespace llmk
