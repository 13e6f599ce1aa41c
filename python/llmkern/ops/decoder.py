"""A Llama-family decoder's CPU decode step in one call -> csrc/decoder/.

``DecodeStepCpu`` runs every decoder layer of a decode-only batch (one new token per sequence) with
the kernels and arguments of the Python layer loop: RMSNorm (fused with the residual add), the
projections, ``decode_append_paged`` (rotate, write the paged cache, attend) and the gated SiLU.
It holds views of the weights and caches it is given and keeps those tensors alive. A runtime
object, not a drop-in op: no torch.library registration.

Projection kinds (``PACKED``, ...) name the kernel front end that runs a projection; csrc/decoder/
decode_step.h lists them (a new kind is a value there and here). The packed kinds take whatever
layout their kernel takes (it checks the weight on every call)."""
from __future__ import annotations

import operator
from typing import List, Optional, Sequence, Tuple

import torch

from .. import _C
from .._backend import dl

PACKED = 0           # linear_packed: a weight packed at load time (pack_linear_weight) (+ bias)
PACKED_SILU_MUL = 1  # linear_packed_silu_mul: gate/up panel pairs (pack_gate_up_weight)
SMALL_M = 2          # linear_small_m: the weight as it is [out, in] (+ bias), up to 16 rows
QUANT = 3            # linear_quant: GGUF-quantised panels (pack_quant_weight) (+ bias)
QUANT_SILU_MUL = 4   # linear_quant_silu_mul: quantised gate/up panel pairs (pack_quant_gate_up)

# The phases a profiled step times, in csrc/decoder/decode_step.h's StepPhase order.
PHASES = ("norms", "qkv", "attention", "o", "gate_up", "down")

# (kind, weight, bias or None, in_features, out_features the kernel writes, silu_and_mul after it,
#  the quantised kinds' layout)
Projection = Tuple[int, torch.Tensor, Optional[torch.Tensor], int, int, bool, int]


class DecodeStepCpu:
    """``step(hidden, residual, decode_positions, decode_block_table)`` runs all layers in place:
    ``residual`` [B, hidden_size] holds the embeddings on entry; ``hidden`` (same shape, any
    values) is overwritten. On return both hold what the Python loop leaves before the final norm
    (residual: the sum up to the last layer's attention; hidden: the last MLP output)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, hidden_size: int,
                 rotary_cos: torch.Tensor, rotary_sin: torch.Tensor, softmax_scale: float,
                 window_size: Tuple[int, int]):
        self._impl = _C.DecodeStepCpu(num_heads, num_kv_heads, head_dim, hidden_size, dl(rotary_cos, "rotary_cos"),
                                      dl(rotary_sin, "rotary_sin"), float(softmax_scale), int(window_size[0]),
                                      int(window_size[1]))
        self._keep: List[torch.Tensor] = [rotary_cos, rotary_sin]  # the C++ side holds views of these
        self._caches: Sequence = ()

    def add_layer(self, input_norm: Tuple[torch.Tensor, float], post_norm: Tuple[torch.Tensor, float],
                  qk_norm: Optional[Tuple[torch.Tensor, torch.Tensor, float]], qkv: Projection, o: Projection,
                  gate_up: Projection, down: Projection) -> None:
        qn, kn, qk_eps = qk_norm if qk_norm is not None else (None, None, 0.0)
        projs = [(kind, dl(w, "weight"), dl(b, "bias"), int(k), int(n), bool(silu), int(layout))
                 for kind, w, b, k, n, silu, layout in (qkv, o, gate_up, down)]
        self._impl.add_layer(dl(input_norm[0], "input_norm"), float(input_norm[1]), dl(post_norm[0], "post_norm"),
                             float(post_norm[1]), dl(qn, "q_norm"), dl(kn, "k_norm"), float(qk_eps), *projs)
        self._keep += [t for t in (input_norm[0], post_norm[0], qn, kn) if t is not None]
        self._keep += [t for p in (qkv, o, gate_up, down) for t in p[1:3] if t is not None]

    def set_kv_caches(self, kv_caches: Sequence[Tuple[torch.Tensor, torch.Tensor]], kv_cache_dtype: str = "auto",
                      kv_scales: Sequence[Tuple[torch.Tensor, torch.Tensor]] = ()) -> None:
        """Binds the per-layer (key_cache, value_cache) pairs; step() uses them until the next call.
        Pairs past the model's layers are ignored (an engine's cache list may also hold a draft
        model's layers after the target's). Quantised caches (the attention ops' kv_cache_dtype):
        kv_scales holds each layer's (k_scale, v_scale)."""
        pairs = list(kv_caches)[:self.num_layers]
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"kv_caches[{i}]: expected a (key_cache, value_cache) pair, got {type(pair).__name__}")
        scales = list(kv_scales)[:self.num_layers]
        self._impl.set_kv_caches([dl(c, f"kv_caches[{i}][{j}]") for i, pair in enumerate(pairs)
                                  for j, c in enumerate(pair)], kv_cache_dtype,
                                 [dl(s, f"kv_scales[{i}][{j}]") for i, pair in enumerate(scales)
                                  for j, s in enumerate(pair)])
        self._caches = tuple(pairs)
        self._keep_scales = scales  # the C++ side holds views of these

    def bound_to(self, kv_caches: Sequence) -> bool:
        """Whether kv_caches starts with the very pairs bound last (identity, element by element)."""
        n = len(self._caches)
        return n > 0 and len(kv_caches) >= n and all(map(operator.is_, kv_caches, self._caches))

    def step(self, hidden: torch.Tensor, residual: torch.Tensor, decode_positions: torch.Tensor,
             decode_block_table: torch.Tensor) -> None:
        self._impl.step(dl(hidden, "hidden"), dl(residual, "residual"), dl(decode_positions, "decode_positions"),
                        dl(decode_block_table, "decode_block_table"))

    def set_profiling(self, on: bool) -> None:
        """On: every step adds each phase's wall time (all layers) to a total, and counts its steps
        and rows; switching it on clears the totals."""
        self._impl.set_profiling(bool(on))

    def profile(self) -> dict:
        """{"steps", "rows", "seconds": {phase: total seconds}} since profiling was switched on.
        Phases (PHASES): the RMSNorms, each projection, and the attention call (rotary, the KV
        append and the paged attention, Qwen3's q/k norms)."""
        steps, rows, seconds = self._impl.profile()
        return {"steps": steps, "rows": rows, "seconds": dict(zip(PHASES, seconds))}

    @property
    def num_layers(self) -> int:
        return self._impl.num_layers
