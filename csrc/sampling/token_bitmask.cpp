// Front of apply_token_bitmask_inplace (xgrammar's signature and semantics): checks, then dispatch.
#include <algorithm>

#include "sampling/sampling.h"
#include "sampling/sampling_checks.h"

namespace llmk {

void apply_token_bitmask_inplace(TensorView logits, TensorView bitmask, std::optional<TensorView> indices,
                                 int64_t vocab_size, int64_t stream) {
  check_ndim(logits, "logits", 2, "[batch_size, vocab_size]");
  check_float(logits, "logits");
  check_last_dim_contiguous(logits, "logits");
  check_dtype(bitmask, "bitmask", DType::I32);
  check_ndim(bitmask, "bitmask", 2, "[batch_size, ceil(vocab_size / 32)]");
  check_same_device(logits, "logits", bitmask, "bitmask");
  check_last_dim_contiguous(bitmask, "bitmask");
  const int64_t rows = logits.size(0), V = logits.size(1), words = bitmask.size(1);
  // xgrammar: without vocab_size, the positions both tensors cover; the rest is left as it is
  const int64_t vocab = vocab_size < 0 ? std::min(V, 32 * words) : vocab_size;
  LLMK_CHECK(vocab <= V, ValueError, "vocab_size: ", vocab, " exceeds the ", V, " columns of logits");
  LLMK_CHECK(vocab <= 32 * words, ValueError, "bitmask: ", words, " words of 32 tokens do not cover vocab_size ",
             vocab, " (need at least ", (vocab + 31) / 32, ")");
  BitmaskArgs a;
  a.logits = logits;
  a.bitmask = bitmask;
  if (indices) {
    check_ndim(*indices, "indices", 1, "[num_indices]");
    check_index(*indices, "indices");
    check_same_device(logits, "logits", *indices, "indices");
    check_contiguous(*indices, "indices");
    check_index_range(*indices, "indices", 0, std::min(rows, bitmask.size(0)), "rows of logits and bitmask");
    a.indices = &*indices;
    a.nrows = indices->size(0);
  } else {
    LLMK_CHECK(bitmask.size(0) == rows, ValueError, "bitmask: ", bitmask.size(0), " rows for the ", rows,
               " rows of logits (without indices the batch sizes must match)");
    a.nrows = rows;
  }
  a.vocab = vocab;
  a.stream = stream;
  if (a.nrows == 0 || vocab == 0) return;
  LLMK_RUN(logits, apply_bitmask, a);
}

}  // namespace llmk
