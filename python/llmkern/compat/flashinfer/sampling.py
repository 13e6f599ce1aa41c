"""``flashinfer.sampling`` (FlashInfer 0.6.x): an engine swaps ``import flashinfer.sampling`` for
``import llmkern.compat.flashinfer.sampling``. Every function has FlashInfer's parameters (names,
order, defaults) and return values; llmkern's extensions come after them, keyword-only.

Kernels are llmkern's (CPU, CUDA), documented in :mod:`llmkern.ops.sampling`. Where behaviour
differs from FlashInfer's:

- Rows that carry no positive finite mass give the row's argmax with ``valid`` False (FlashInfer
  leaves such rows unspecified); ``check_nan=True`` also rejects ``+inf``.
- Ties at a top-k / top-p boundary are all kept (FlashInfer keeps some of them).
- ``top_k_top_p_sampling_from_logits`` draws from the probabilities :func:`softmax` computes (not
  ``torch.softmax``), so it matches ``top_k_top_p_sampling_from_probs(softmax(logits))`` exactly and
  the same call on ``torch.softmax(logits)`` up to the last-ulp differences of the two softmaxes.
- ``seed`` / ``offset`` may mix a tensor and an int (FlashInfer requires both of one kind).
- ``deterministic`` / ``is_deterministic`` / ``enable_pdl`` are accepted; every path is
  deterministic and PDL is a CUDA launch detail.
- Per-row parameters (``top_p``, ``top_k``, ``min_p``) are checked as FlashInfer checks them and
  with its messages (:mod:`._params`): a number or a 1-D tensor of one value per output row; a 0-d
  tensor, a 2-D one or a wrong length is a ValueError. (``llmkern.ops.sampling`` itself also takes
  a 0-d or ``(1,)`` tensor as one value for every row.) Other errors name the argument in
  llmkern's words (ValueError / TypeError).
"""
from ...ops import sampling as _ops
from ...ops.sampling import chain_speculative_sampling, sampling_from_logits, sampling_from_probs, softmax
from ._params import flashinfer_row_params

top_p_sampling_from_probs = flashinfer_row_params(_ops.top_p_sampling_from_probs)
top_k_sampling_from_probs = flashinfer_row_params(_ops.top_k_sampling_from_probs)
min_p_sampling_from_probs = flashinfer_row_params(_ops.min_p_sampling_from_probs)
top_k_top_p_sampling_from_logits = flashinfer_row_params(_ops.top_k_top_p_sampling_from_logits)
top_k_top_p_sampling_from_probs = flashinfer_row_params(_ops.top_k_top_p_sampling_from_probs)
top_p_renorm_probs = top_p_renorm_prob = flashinfer_row_params(_ops.top_p_renorm_probs)
top_k_renorm_probs = top_k_renorm_prob = flashinfer_row_params(_ops.top_k_renorm_probs)
top_k_mask_logits = flashinfer_row_params(_ops.top_k_mask_logits)

__all__ = [
    "softmax",
    "sampling_from_logits",
    "sampling_from_probs",
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_renorm_prob",
    "top_k_renorm_probs",
    "top_k_renorm_prob",
    "top_k_mask_logits",
    "chain_speculative_sampling",
]
