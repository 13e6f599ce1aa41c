// Front of chain speculative sampling (FlashInfer signature): checks, then dispatch.
#include "sampling/sampling.h"
#include "sampling/sampling_checks.h"

namespace llmk {

void chain_speculative_sampling(std::optional<TensorView> draft_probs, TensorView draft_token_ids,
                                TensorView target_probs, TensorView out, TensorView accepted,
                                TensorView emitted, std::optional<TensorView> seed_arr, int64_t seed_val,
                                std::optional<TensorView> offset_arr, int64_t offset_val,
                                std::optional<TensorView> token_bitmask, int64_t stream) {
  check_ndim(target_probs, "target_probs", 3, "[batch_size, num_speculate_tokens + 1, vocab_size]");
  check_dtype(target_probs, "target_probs", DType::F32);
  check_last_dim_contiguous(target_probs, "target_probs");
  const int64_t b = target_probs.size(0), n1 = target_probs.size(1), vocab = target_probs.size(2);
  LLMK_CHECK(n1 >= 1, ValueError, "target_probs: dim 1 must be num_speculate_tokens + 1 >= 1, got shape ",
             shape_str(target_probs));
  LLMK_CHECK(vocab >= 1 || b == 0, ValueError, "target_probs: vocab_size must be >= 1");
  const int64_t n = n1 - 1;
  check_shape(draft_token_ids, "draft_token_ids", {b, n}, "[batch_size, num_speculate_tokens] (from target_probs)");
  check_index(draft_token_ids, "draft_token_ids");
  check_same_device(target_probs, "target_probs", draft_token_ids, "draft_token_ids");
  check_contiguous(draft_token_ids, "draft_token_ids");
  check_index_range(draft_token_ids, "draft_token_ids", 0, vocab, "vocab_size");
  if (draft_probs) {
    check_shape(*draft_probs, "draft_probs", {b, n, vocab},
                "[batch_size, num_speculate_tokens, vocab_size] (from target_probs)");
    check_dtype(*draft_probs, "draft_probs", DType::F32);
    check_same_device(target_probs, "target_probs", *draft_probs, "draft_probs");
    check_last_dim_contiguous(*draft_probs, "draft_probs");
  }
  check_shape(out, "out", {b, n1}, "[batch_size, num_speculate_tokens + 1]");
  check_dtype(out, "out", DType::I32);
  check_contiguous(out, "out");
  check_row_vector(accepted, "maybe_output_accepted_token_num", b, target_probs, true);
  check_row_vector(emitted, "maybe_output_emitted_draft_token_num", b, target_probs, true);
  SpecArgs a;
  a.draft_probs = draft_probs ? &*draft_probs : nullptr;
  a.draft_ids = draft_token_ids;
  a.target_probs = target_probs;
  a.out = out;
  a.accepted = accepted;
  a.emitted = emitted;
  a.seed = seed_param(seed_arr, seed_val, "seed", b, target_probs);
  a.offset = seed_param(offset_arr, offset_val, "offset", b, target_probs);
  if (token_bitmask) {
    check_bitmask(*token_bitmask, "token_bitmask", {b, n1}, vocab, target_probs,
                  "[batch_size, num_speculate_tokens + 1, ceil(vocab_size / 32)]");
    a.bitmask = &*token_bitmask;
  }
  a.stream = stream;
  if (b == 0) return;
  LLMK_RUN(target_probs, chain_speculative, a);
}

}  // namespace llmk
