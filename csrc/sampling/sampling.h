// Sampling ops (FlashInfer signatures): the contract between the fronts (sampling.cpp: argument
// checks) and the kernels (sampling_cpu.cpp, sampling.cu). Python: python/llmkern/ops/sampling.py.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "common/dispatch.h"
#include "common/tensor.h"

namespace llmk {

// A per-row parameter given either as a tensor of shape [batch] (or [1]) or as one scalar.
struct RowParam {
  const TensorView* arr = nullptr;  // float32 (or int32/int64 for top_k / seeds), contiguous
  double val = 0.0;
  uint64_t uval = 0;                // seeds and offsets as scalars
};

// One sampling call: rows of probabilities or logits, per-row filters, per-row randomness.
struct SampleArgs {
  TensorView x;                       // [rows, vocab] probs or logits (fp32/fp16/bf16)
  bool is_logits = false;
  const TensorView* indices = nullptr;  // [batch] int32/int64: output i samples row indices[i]
  int64_t batch = 0;                  // number of outputs
  RowParam temperature;               // logits only; 0 = greedy
  RowParam top_k;                     // 0 = off
  RowParam top_p;                     // 1 = off
  RowParam min_p;                     // 0 = off
  bool k_first = true;                // filter_apply_order == "top_k_first"
  RowParam seed, offset;              // arr: int64 [1] or [batch]
  const TensorView* bitmask = nullptr;  // [batch, words] int32 allowed tokens of output row i, or null
  TensorView out;                     // [batch] int32/int64
  TensorView valid;                   // [batch] bool
  int64_t stream = 0;                 // CUDA stream (cudaStream_t as an integer)
};

// Exact filtering of whole rows: top_k_renorm_probs / top_p_renorm_probs / top_k_mask_logits.
enum class RenormKind : int { TopK = 0, TopP = 1, MaskLogitsTopK = 2 };
struct RenormArgs {
  TensorView x;    // [batch, vocab]
  TensorView out;  // [batch, vocab], same dtype
  RenormKind kind = RenormKind::TopK;
  RowParam param;  // top_k or top_p
  int64_t stream = 0;
};

// softmax(x / temperature) per row into fp32 (temperature 0: one-hot at the argmax; a row with no
// finite maximum, or a +inf logit: zeros). The weights sampling from logits uses, exactly.
struct SoftmaxArgs {
  TensorView x;    // [batch, vocab] fp32/fp16/bf16 logits
  TensorView out;  // [batch, vocab] fp32
  RowParam temperature;
  const TensorView* bitmask = nullptr;  // [batch, words] int32 allowed tokens, or null
  int64_t stream = 0;
};

// apply_token_bitmask_inplace (xgrammar's semantics): logits[r, j] = -inf for j < vocab where bit j
// of bitmask row r is clear, for r in rows (indices, or every row).
struct BitmaskArgs {
  TensorView logits;                    // [rows, V] fp32/fp16/bf16, updated in place
  TensorView bitmask;                   // [rows_b, words] int32
  const TensorView* indices = nullptr;  // [n] int32/int64 rows, or null: rows 0..rows-1
  int64_t nrows = 0;                    // rows visited
  int64_t vocab = 0;                    // positions masked: [0, vocab)
  int64_t stream = 0;
};

struct SpecArgs {
  const TensorView* draft_probs = nullptr;  // [b, n, V] fp32, or null: one-hot drafts
  TensorView draft_ids;                     // [b, n] int32/int64
  TensorView target_probs;                  // [b, n + 1, V] fp32
  TensorView out;                           // [b, n + 1] int32
  TensorView accepted;                      // [b] int32/int64, incremented
  TensorView emitted;                       // [b] int32/int64, incremented
  const TensorView* bitmask = nullptr;      // [b, n + 1, words] int32 allowed tokens per position, or null
  RowParam seed, offset;
  int64_t stream = 0;
};

struct PenaltyArgs {
  TensorView logits;                        // [b, V] fp32/fp16/bf16, updated in place
  const TensorView* output_counts = nullptr;  // [b, V] int32/int64
  const TensorView* output_ids = nullptr;     // [b, L] int32/int64, -1 = padding
  const TensorView* prompt_mask = nullptr;    // [b, V] bool
  const TensorView* prompt_ids = nullptr;     // [b, Lp] int32/int64, -1 = padding
  RowParam repetition, frequency, presence;   // float32 [b] or scalars
  int64_t stream = 0;
};

}  // namespace llmk

// Kernel entry points (arguments validated by the fronts).
LLMK_DECLARE_KERNEL(sample_rows, (const SampleArgs& a))
LLMK_DECLARE_KERNEL(renorm_rows, (const RenormArgs& a))
LLMK_DECLARE_KERNEL(softmax_rows, (const SoftmaxArgs& a))
LLMK_DECLARE_KERNEL(chain_speculative, (const SpecArgs& a))
LLMK_DECLARE_KERNEL(apply_penalties, (const PenaltyArgs& a))
LLMK_DECLARE_KERNEL(apply_bitmask, (const BitmaskArgs& a))

namespace llmk {

// Fronts (bound to Python one-to-one). Per-row parameters come as (tensor or None, scalar).
void sample(TensorView x, bool is_logits, std::optional<TensorView> indices,
            std::optional<TensorView> temperature_arr, double temperature_val,
            std::optional<TensorView> top_k_arr, int64_t top_k_val,
            std::optional<TensorView> top_p_arr, double top_p_val,
            std::optional<TensorView> min_p_arr, double min_p_val, const std::string& filter_apply_order,
            std::optional<TensorView> seed_arr, int64_t seed_val, std::optional<TensorView> offset_arr,
            int64_t offset_val, std::optional<TensorView> token_bitmask, TensorView out, TensorView valid,
            int64_t stream);
void renorm(TensorView x, TensorView out, const std::string& kind, std::optional<TensorView> arr,
            double val, int64_t stream);
void softmax(TensorView x, TensorView out, std::optional<TensorView> temperature_arr, double temperature_val,
             std::optional<TensorView> token_bitmask, int64_t stream);
void chain_speculative_sampling(std::optional<TensorView> draft_probs, TensorView draft_token_ids,
                                TensorView target_probs, TensorView out, TensorView accepted,
                                TensorView emitted, std::optional<TensorView> seed_arr, int64_t seed_val,
                                std::optional<TensorView> offset_arr, int64_t offset_val,
                                std::optional<TensorView> token_bitmask, int64_t stream);
void apply_penalties(TensorView logits, std::optional<TensorView> output_token_counts,
                     std::optional<TensorView> output_token_ids, std::optional<TensorView> prompt_mask,
                     std::optional<TensorView> prompt_token_ids, std::optional<TensorView> repetition_arr,
                     double repetition_val, std::optional<TensorView> frequency_arr, double frequency_val,
                     std::optional<TensorView> presence_arr, double presence_val, int64_t stream);
void apply_token_bitmask_inplace(TensorView logits, TensorView bitmask, std::optional<TensorView> indices,
                                 int64_t vocab_size, int64_t stream);

}  // namespace llmk
