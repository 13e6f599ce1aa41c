"""Sampling ops (FlashInfer signatures) -> csrc/sampling/.

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
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch

from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

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
]

Scalar = Union[torch.Tensor, float]
Seed = Optional[Union[int, torch.Tensor]]

_ORDERS = ("top_k_first", "joint")


# ---------------------------------------------------------------------------------------------
# Argument plumbing
# ---------------------------------------------------------------------------------------------


def _param(value, name: str, integral: bool = False):
    """(tensor or None, scalar) for a per-row parameter."""
    if isinstance(value, torch.Tensor):
        t = value.reshape(1) if value.dim() == 0 else value
        if integral:
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: expected an int32 or int64 tensor, got {t.dtype}")
        elif t.dtype != torch.float32:
            # integer thresholds (torch.full((B,), 1) for top_p) are converted, as FlashInfer does
            if t.dtype == torch.bool or t.is_complex():
                raise TypeError(f"{name}: expected a real-valued tensor, got {t.dtype}")
            t = t.float()
        return t.contiguous(), 0 if integral else 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number or a tensor, got {type(value).__name__}")
    if integral:
        if int(value) != value:
            raise ValueError(f"{name}: expected an integer, got {value}")
        return None, int(value)
    return None, float(value)


def _to_i64(v: int, name: str) -> int:
    if not -(2**63) <= v < 2**64:
        raise ValueError(f"{name}: expected a 64-bit integer, got {v}")
    return v - 2**64 if v >= 2**63 else v


def _seed_offset(seed: Seed, offset: Seed, generator, device):
    """(seed_arr, seed_val, offset_arr, offset_val): explicit values, or two draws from the
    generator (a tensor, so no host synchronisation and CUDA-graph friendly)."""
    if seed is None or offset is None:
        dev = generator.device if generator is not None else device
        s = torch.randint(0, 2**62, (2,), dtype=torch.int64, generator=generator, device=dev)
        if s.device != device:
            s = s.to(device)
        return s[0:1], 0, s[1:2], 0
    out = []
    for v, name in ((seed, "seed"), (offset, "offset")):
        if isinstance(v, torch.Tensor):
            t = v.reshape(1) if v.dim() == 0 else v
            if t.dtype != torch.int64:
                raise TypeError(f"{name}: expected an int64 tensor, got {t.dtype}")
            out += [t.contiguous(), 0]
        elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out += [None, _to_i64(int(v), name)]
        else:
            raise TypeError(f"{name}: expected an int or an int64 tensor, got {type(v).__name__}")
    return tuple(out)


def _check_nan(x: torch.Tensor, name: str, logits: bool) -> None:
    bad = torch.isnan(x).any() | (torch.isposinf(x).any() if logits else torch.isinf(x).any())
    if bool(bad):
        what = "NaN or +inf" if logits else "NaN or inf"
        raise ValueError(f"{name}: contains {what} (check_nan=True)")


def _order(filter_apply_order) -> str:
    if filter_apply_order not in _ORDERS:
        raise ValueError(f"filter_apply_order: expected 'top_k_first' or 'joint', got {filter_apply_order!r}")
    return filter_apply_order


# ---------------------------------------------------------------------------------------------
# Registered kernel ops (flat schemas: tensors and scalars only)
# ---------------------------------------------------------------------------------------------


def _sampler_op(name: str):
    @kernel_op(name)
    def impl(
        x: torch.Tensor,
        is_logits: bool,
        indices: Optional[torch.Tensor],
        temperature_arr: Optional[torch.Tensor],
        temperature_val: float,
        top_k_arr: Optional[torch.Tensor],
        top_k_val: int,
        top_p_arr: Optional[torch.Tensor],
        top_p_val: float,
        min_p_arr: Optional[torch.Tensor],
        min_p_val: float,
        filter_apply_order: str,
        seed_arr: Optional[torch.Tensor],
        seed_val: int,
        offset_arr: Optional[torch.Tensor],
        offset_val: int,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        batch = indices.size(0) if indices is not None else x.size(0)
        out = torch.empty(batch, dtype=indices.dtype if indices is not None else torch.int32, device=x.device)
        valid = torch.empty(batch, dtype=torch.bool, device=x.device)
        lib_for(x).sample(
            dl(x), is_logits, dl(indices), dl(temperature_arr), temperature_val, dl(top_k_arr), top_k_val,
            dl(top_p_arr), top_p_val, dl(min_p_arr), min_p_val, filter_apply_order, dl(seed_arr), seed_val,
            dl(offset_arr), offset_val, dl(out), dl(valid), stream_of(x),
        )
        return out, valid

    @impl.op.register_fake
    def _(x, is_logits, indices, *args):
        batch = indices.size(0) if indices is not None else x.size(0)
        dtype = indices.dtype if indices is not None else torch.int32
        return x.new_empty(batch, dtype=dtype), x.new_empty(batch, dtype=torch.bool)

    return impl


_ops = {n: _sampler_op(n) for n in __all__[:7]}


def _sample(opname, x, is_logits, indices, temperature, top_k, top_p, min_p, order, deterministic,
            generator, check_nan, seed, offset, return_valid):
    name = "logits" if is_logits else "probs"
    require_tensor(x, name)
    if indices is not None:
        require_tensor(indices, "indices")
    if check_nan:
        _check_nan(x, name, is_logits)
    t_arr, t_val = _param(1.0 if temperature is None else temperature, "temperature")
    k_arr, k_val = _param(top_k, "top_k", integral=True)
    p_arr, p_val = _param(top_p, "top_p")
    m_arr, m_val = _param(min_p, "min_p")
    s_arr, s_val, o_arr, o_val = _seed_offset(seed, offset, generator, x.device)
    samples, valid = _ops[opname](x, is_logits, indices, t_arr, t_val, k_arr, k_val, p_arr, p_val, m_arr,
                                  m_val, _order(order), s_arr, s_val, o_arr, o_val)
    return (samples, valid) if return_valid else samples


def _public(opname):
    def deco(fn):
        fn.op = _ops[opname].op
        return fn

    return deco


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


@_public("sampling_from_probs")
def sampling_from_probs(
    probs: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
):
    """Sample one token per row from ``probs`` (weights; see the module docstring for the row,
    randomness and NaN rules). Returns ``samples`` ``(batch_size,)``, or ``(samples, valid)`` with
    ``return_valid=True``. ``deterministic`` is accepted for compatibility: every path is
    deterministic."""
    return _sample("sampling_from_probs", probs, False, indices, None, 0, 1.0, 0.0, "joint", deterministic,
                   generator, check_nan, seed, offset, return_valid)


@_public("sampling_from_logits")
def sampling_from_logits(
    logits: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    *,
    temperature: Optional[Scalar] = None,
    return_valid: bool = False,
):
    """Sample from ``softmax(logits / temperature)`` without materialising the probabilities.
    The draw is the one :func:`sampling_from_probs` makes from :func:`softmax`'s output with the
    same seed (the kernel computes those very probabilities).

    llmkern extensions (keyword-only): ``temperature`` (default 1) is a number or a
    ``(batch_size,)`` tensor, 0 meaning greedy for that row (argmax, lowest index on ties);
    ``return_valid``."""
    return _sample("sampling_from_logits", logits, True, indices, temperature, 0, 1.0, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid)


@_public("top_k_sampling_from_probs")
def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
):
    """Top-k sampling: draw from the renormalised weights of the tokens with fewer than ``top_k``
    strictly larger weights (ties at the boundary are all kept). ``top_k`` 0 or ``vocab_size``
    keeps every token."""
    return _sample("top_k_sampling_from_probs", probs, False, indices, None, top_k, 1.0, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid)


@_public("top_p_sampling_from_probs")
def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
):
    """Top-p (nucleus) sampling: draw from the tokens whose strictly-greater mass is below
    ``top_p`` times the row's mass (the smallest high-probability set reaching ``top_p``, plus every
    token tied with its last member)."""
    return _sample("top_p_sampling_from_probs", probs, False, indices, None, 0, top_p, 0.0, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid)


@_public("min_p_sampling_from_probs")
def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
):
    """Min-p sampling: draw from the tokens with ``w >= min_p * max(w)``."""
    return _sample("min_p_sampling_from_probs", probs, False, indices, None, 0, 1.0, min_p, "joint",
                   deterministic, generator, check_nan, seed, offset, return_valid)


@_public("top_k_top_p_sampling_from_logits")
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    *,
    temperature: Optional[Scalar] = None,
    return_valid: bool = False,
):
    """Top-k and top-p sampling from ``softmax(logits / temperature)``, fused (one kernel, the
    probabilities are never written out).

    ``filter_apply_order="top_k_first"``: top-p applies to the top-k set renormalised;
    ``"joint"``: a token must pass both filters on the full distribution. The kernel samples from
    the probabilities :func:`softmax` computes, so for the same seed it draws the token
    :func:`top_k_top_p_sampling_from_probs` draws from ``softmax(logits)`` (exactly; on CPU rows
    taking the one-pass small-k path of ``top_k_first`` up to rare rounding of sums).
    llmkern extensions (keyword-only): ``temperature`` (default 1; 0 = greedy) is a number or a
    ``(batch_size,)`` tensor; ``return_valid``."""
    return _sample("top_k_top_p_sampling_from_logits", logits, True, indices, temperature, top_k, top_p, 0.0,
                   filter_apply_order, deterministic, generator, check_nan, seed, offset, return_valid)


@_public("top_k_top_p_sampling_from_probs")
def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: Union[torch.Tensor, int],
    top_p: Scalar,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
):
    """Top-k and top-p sampling from probabilities (filter orders as in
    :func:`top_k_top_p_sampling_from_logits`)."""
    return _sample("top_k_top_p_sampling_from_probs", probs, False, indices, None, top_k, top_p, 0.0,
                   filter_apply_order, deterministic, generator, check_nan, seed, offset, return_valid)


# ---------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------


@kernel_op("softmax")
def _softmax(logits: torch.Tensor, temperature_arr: Optional[torch.Tensor], temperature_val: float) -> torch.Tensor:
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    lib_for(logits).softmax(dl(logits), dl(out), dl(temperature_arr), temperature_val, stream_of(logits))
    return out


@_softmax.op.register_fake
def _(logits, temperature_arr, temperature_val):
    return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)


def softmax(
    logits: torch.Tensor,
    temperature: Optional[Scalar] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``softmax(logits / temperature)`` per row, as float32 ``(batch_size, vocab_size)``
    (FlashInfer signature). ``temperature``: a number or a ``(batch_size,)`` tensor (default 1);
    llmkern defines temperature 0 as the one-hot of the row's argmax (lowest index on ties). ``-inf``
    logits get probability 0; a row with no finite logit, or with a ``+inf`` logit, becomes all
    zeros (the degenerate rows of the module docstring). These are exactly the probabilities the
    ``*_from_logits`` samplers draw from. ``enable_pdl`` (a CUDA launch hint) is accepted and
    ignored."""
    require_tensor(logits, "logits")
    t_arr, t_val = _param(1.0 if temperature is None else temperature, "temperature")
    return _softmax(logits, t_arr, t_val)


softmax.op = _softmax.op


# ---------------------------------------------------------------------------------------------
# Renormalisation and masking (exact thresholds found by pivot searches, no sorting)
# ---------------------------------------------------------------------------------------------


def _renorm_op(name: str, kind: str):
    @kernel_op(name)
    def impl(x: torch.Tensor, arr: Optional[torch.Tensor], val: float) -> torch.Tensor:
        out = torch.empty_like(x)
        lib_for(x).renorm(dl(x), dl(out), kind, dl(arr), val, stream_of(x))
        return out

    @impl.op.register_fake
    def _(x, arr, val):
        return torch.empty_like(x)

    return impl


_top_p_renorm = _renorm_op("top_p_renorm_probs", "top_p")
_top_k_renorm = _renorm_op("top_k_renorm_probs", "top_k")
_top_k_mask = _renorm_op("top_k_mask_logits", "mask_logits")


def top_p_renorm_probs(probs: torch.Tensor, top_p: Scalar, is_deterministic: bool = False) -> torch.Tensor:
    """Keep the top-p set (tie rule of the module docstring) and renormalise it to sum to 1;
    other entries become 0. Rows without positive finite mass become all zeros. Same dtype as
    ``probs``; always deterministic."""
    require_tensor(probs, "probs")
    arr, val = _param(top_p, "top_p")
    return _top_p_renorm(probs, arr, val)


top_p_renorm_probs.op = _top_p_renorm.op


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int], *, is_deterministic: bool = False) -> torch.Tensor:
    """Keep the top-k set (every token tied with the k-th largest included) and renormalise it;
    other entries become 0. ``top_k`` 0 or ``vocab_size`` keeps all."""
    require_tensor(probs, "probs")
    arr, val = _param(top_k, "top_k", integral=True)
    return _top_k_renorm(probs, arr, float(val))


top_k_renorm_probs.op = _top_k_renorm.op
top_p_renorm_prob = top_p_renorm_probs  # FlashInfer's aliases
top_k_renorm_prob = top_k_renorm_probs


def top_k_mask_logits(logits: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Set every logit outside the top-k to ``-inf`` (ties with the k-th largest kept; NaN becomes
    ``-inf``). Same dtype as ``logits``."""
    require_tensor(logits, "logits")
    arr, val = _param(top_k, "top_k", integral=True)
    return _top_k_mask(logits, arr, float(val))


top_k_mask_logits.op = _top_k_mask.op


# ---------------------------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------------------------


@kernel_op("chain_speculative_sampling", mutates_args=("accepted", "emitted"))
def _chain_spec(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted: torch.Tensor,
    emitted: torch.Tensor,
    seed_arr: Optional[torch.Tensor],
    seed_val: int,
    offset_arr: Optional[torch.Tensor],
    offset_val: int,
) -> torch.Tensor:
    b, n1 = target_probs.shape[0], target_probs.shape[1] if target_probs.dim() > 1 else 0
    out = torch.empty(b, n1, dtype=torch.int32, device=target_probs.device)
    lib_for(target_probs).chain_speculative_sampling(
        dl(draft_probs), dl(draft_token_ids), dl(target_probs), dl(out), dl(accepted), dl(emitted),
        dl(seed_arr), seed_val, dl(offset_arr), offset_val, stream_of(target_probs),
    )
    return out


@_chain_spec.op.register_fake
def _(draft_probs, draft_token_ids, target_probs, accepted, emitted, *args):
    return target_probs.new_empty(target_probs.shape[0], target_probs.shape[1], dtype=torch.int32)


def chain_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Seed = None,
    offset: Seed = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify chains of draft tokens against the target model (speculative sampling).

    ``draft_probs (b, n, V)`` (float32), ``draft_token_ids (b, n)``, ``target_probs (b, n + 1, V)``.
    Draft token ``i`` is accepted when ``u * q < p`` (``u`` uniform in [0, 1), ``q``/``p`` the draft
    and target probabilities of the token); at the first rejection the token is drawn from the
    normalised ``relu(target - draft)`` (from the target row when that has no mass), and the rest
    of the row is ``-1``; when every draft is accepted a bonus token is drawn from
    ``target_probs[:, n]``. The emitted tokens are distributed exactly as the target model's.

    **Drafts without probabilities** (n-gram / prompt-lookup proposers): pass
    ``draft_probs=None``. The draft is then one-hot (``q = 1`` for the proposed token), so token
    ``i`` is accepted with probability ``p(token)`` and a rejection draws from the target row
    without the proposed token — still exact for the target distribution.

    Returns ``(output_token_ids (b, n + 1) int32, accepted_token_num, emitted_draft_token_num)``.
    The two counters (``(b,)``, int32 unless given) are *added to* when passed in:
    ``accepted`` counts positions whose test passes independently of earlier rejections,
    ``emitted`` the draft tokens actually emitted (the bonus / resampled token excluded).
    Randomness: draw ``i`` of request ``r`` at counter ``(offset, r, i)``, see the module docstring."""
    require_tensor(target_probs, "target_probs")
    require_tensor(draft_token_ids, "draft_token_ids")
    if draft_probs is not None:
        require_tensor(draft_probs, "draft_probs")
    b = target_probs.shape[0] if target_probs.dim() > 0 else 0
    dev = target_probs.device
    acc = maybe_output_accepted_token_num
    emi = maybe_output_emitted_draft_token_num
    if acc is None:
        acc = torch.zeros(b, dtype=torch.int32, device=dev)
    else:
        require_tensor(acc, "maybe_output_accepted_token_num")
    if emi is None:
        emi = torch.zeros(b, dtype=torch.int32, device=dev)
    else:
        require_tensor(emi, "maybe_output_emitted_draft_token_num")
    s_arr, s_val, o_arr, o_val = _seed_offset(seed, offset, generator, dev)
    out = _chain_spec(draft_probs, draft_token_ids, target_probs, acc, emi, s_arr, s_val, o_arr, o_val)
    return out, acc, emi


chain_speculative_sampling.op = _chain_spec.op


# ---------------------------------------------------------------------------------------------
# Penalties
# ---------------------------------------------------------------------------------------------


@kernel_op("apply_penalties", mutates_args=("logits",))
def _apply_penalties(
    logits: torch.Tensor,
    output_token_counts: Optional[torch.Tensor],
    output_token_ids: Optional[torch.Tensor],
    prompt_mask: Optional[torch.Tensor],
    prompt_token_ids: Optional[torch.Tensor],
    rep_arr: Optional[torch.Tensor],
    rep_val: float,
    freq_arr: Optional[torch.Tensor],
    freq_val: float,
    pres_arr: Optional[torch.Tensor],
    pres_val: float,
) -> None:
    lib_for(logits).apply_penalties(
        dl(logits), dl(output_token_counts), dl(output_token_ids), dl(prompt_mask), dl(prompt_token_ids),
        dl(rep_arr), rep_val, dl(freq_arr), freq_val, dl(pres_arr), pres_val, stream_of(logits),
    )


@_apply_penalties.op.register_fake
def _(logits, *args):
    return None


def apply_penalties(
    logits: torch.Tensor,
    output_token_counts: Optional[torch.Tensor] = None,
    repetition_penalties: Scalar = 1.0,
    frequency_penalties: Scalar = 0.0,
    presence_penalties: Scalar = 0.0,
    prompt_mask: Optional[torch.Tensor] = None,
    output_token_ids: Optional[torch.Tensor] = None,
    prompt_token_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Apply repetition / frequency / presence penalties to ``logits (b, V)`` in place (vLLM
    semantics) and return it.

    For tokens seen in the prompt or the output, the repetition penalty divides positive logits
    and multiplies the others; then ``logit -= frequency * count + presence * (count > 0)`` with
    ``count`` the token's occurrences in the output. The output side is given as dense
    ``output_token_counts (b, V)`` or as ``output_token_ids (b, L)``; the prompt side as
    ``prompt_mask (b, V)`` bool or ``prompt_token_ids (b, Lp)``. Token-id tensors are padded with
    ``-1`` or ``vocab_size`` (vLLM's padding). Penalties are numbers or ``(b,)`` tensors;
    ``repetition > 0``."""
    require_tensor(logits, "logits")
    for t, n in ((output_token_counts, "output_token_counts"), (prompt_mask, "prompt_mask"),
                 (output_token_ids, "output_token_ids"), (prompt_token_ids, "prompt_token_ids")):
        if t is not None:
            require_tensor(t, n)
    r_arr, r_val = _param(repetition_penalties, "repetition_penalties")
    f_arr, f_val = _param(frequency_penalties, "frequency_penalties")
    p_arr, p_val = _param(presence_penalties, "presence_penalties")
    _apply_penalties(logits, output_token_counts, output_token_ids, prompt_mask, prompt_token_ids, r_arr, r_val,
                     f_arr, f_val, p_arr, p_val)
    return logits


apply_penalties.op = _apply_penalties.op
