"""Sampling ops (FlashInfer signatures) -> csrc/sampling/: the import path of every sampling op.

The ops live by concern in samplers.py (the ``*_sampling_from_*`` draws), sampling_filters.py
(softmax, top-k / top-p renormalisation and masking), speculative.py (chain speculative
sampling), token_bitmask.py (grammar masks) and penalties.py, over _sampling_args.py (argument
checks); this module re-exports them and states the rules they share.

Common rules of every op in this module:

- **Rows.** ``probs`` / ``logits`` are ``(batch_size, vocab_size)``, float32, float16 or bfloat16,
  with a contiguous last dimension. ``indices`` (int32/int64, ``(batch_size,)``) makes output ``i``
  sample row ``indices[i]``; per-row parameters and the random stream then follow the output row.
  Outputs are int32, or ``indices.dtype`` when given.
- **Per-row parameters** (``top_k``, ``top_p``, ``min_p``, ``temperature``) are a Python number
  (same for every row) or a tensor of shape ``(batch_size,)``. ``top_k`` in ``[0, vocab_size]``
  (0 = no top-k), ``top_p`` in ``[0, 1]`` (1 = no top-p, 0 = only the most likely token and its
  ties), ``min_p`` in ``[0, 1]`` (0 = no min-p),
  ``temperature >= 0`` (0 = greedy: the row's argmax, lowest index on ties). Out-of-range values
  raise ``ValueError`` (checked for CPU tensors and scalars).
- **Filters and ties.** Probabilities need not be normalised: a row is a vector of weights and
  only entries ``> 0`` carry mass. Every filter keeps an upper set of the weights, and keeps every
  token tied with the boundary:

  * top-k keeps ``w_i`` iff fewer than ``k`` weights are strictly greater (so more than ``k``
    tokens survive when the k-th largest weight is tied);
  * top-p keeps ``w_i`` iff the mass strictly greater than ``w_i`` is below ``top_p`` times the
    row's mass (times the top-k set's mass for ``filter_apply_order="top_k_first"``);
  * min-p keeps ``w_i`` iff ``w_i >= min_p * max(w)``.

  The kernels never sort the vocabulary: they draw a candidate from the weights above a lower
  pivot (inverse CDF), test it and a second pivot against the filter in one pass, raise the
  lower pivot and repeat (rejection sampling; at most ~33 rounds, typically 1-4). With top-k
  (alone, or before top-p) the top-k set is found exactly first and the draw is made inside it;
  on CPU, for ``k <= 1024``, that set comes from one pass over the row that keeps a short
  candidate list under a rising threshold.
- **Randomness.** Counter-based Philox 4x32-10: draw ``d`` of output row ``i`` uses counter
  ``(offset, i, d)`` under key ``seed``. Pass ``seed`` and ``offset`` (ints, or int64 tensors of
  shape ``(1,)`` / ``(batch_size,)`` for CUDA graphs) for explicit control — advance ``offset``
  between calls; otherwise both are drawn from ``generator`` (or torch's default generator for the
  device), so ``torch.manual_seed`` makes results reproducible. Results do not depend on the
  number of threads.
- **NaN / inf.** With ``check_nan=True`` a NaN or infinite probability (NaN or ``+inf`` logit)
  raises ``ValueError`` (this reads the tensor: a host synchronisation on CUDA). Otherwise NaN,
  negative and ``-inf`` entries are treated as zero mass (``-inf`` logits are masks), and a row
  with no positive finite mass (all zero, or containing ``+inf``/overflowing) is *degenerate*: its
  output is the row's argmax (first ``+inf``; index 0 when every entry is NaN) and its ``valid``
  flag (``return_valid=True``) is False.
- **CPU and CUDA.** Both backends apply the same filter rules, pivot updates and Philox stream
  (one CUDA thread block per output row), so for the same seed they keep the same sets and draw
  the same tokens, except where their floating-point sums of the weights differ by rounding right
  at a token boundary (rare; never when the sums are exact). CUDA calls launch on the current
  stream, allocate nothing and never synchronise the host (``check_nan=True`` excepted), so they
  can be captured in CUDA graphs: pass ``seed``/``offset`` as device tensors and advance
  ``offset`` between replays. The CUDA build flushes subnormal floats (below ~1.2e-38) to zero,
  so such weights carry no mass there.
- **Token bitmask** (keyword ``token_bitmask`` of every sampler and of :func:`softmax`): int32
  ``(batch_size, words)``, xgrammar's packed layout (bit ``j % 32`` of word ``j // 32`` set: token
  ``j`` allowed), one row per *output* row (with ``indices``: the output's row, not the input
  row's). The kernels apply it as they read the row, before temperature and every filter:
  a disallowed token is exactly a ``-inf`` logit / zero probability, and top-k / top-p / min-p act
  on the masked distribution (as with xgrammar's masking followed by sampling). ``words`` must
  cover the vocabulary (``>= ceil(vocab_size / 32)``, extra words and bits past ``vocab_size``
  are ignored): unlike xgrammar's in-place op, which leaves uncovered tokens unmasked, a narrower
  mask is a ``ValueError``. A row whose mask allows no token with mass is degenerate
  (``valid=False``). A mask allowing every token draws what no mask draws.
"""
from ._sampling_args import Scalar, Seed  # noqa: F401  (the parameter types, for annotations)
from .penalties import apply_penalties
from .samplers import (
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_sampling_from_probs,
)
from .sampling_filters import (
    softmax,
    top_k_mask_logits,
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_p_renorm_prob,
    top_p_renorm_probs,
)
from .speculative import chain_speculative_sampling
from .token_bitmask import apply_token_bitmask_inplace

__all__ = [
    "sampling_from_probs",
    "sampling_from_logits",
    "top_k_sampling_from_probs",
    "top_p_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_k_mask_logits",
    "top_p_renorm_probs",
    "top_k_renorm_probs",
    "chain_speculative_sampling",
    "apply_penalties",
    "softmax",
    "apply_token_bitmask_inplace",
]
