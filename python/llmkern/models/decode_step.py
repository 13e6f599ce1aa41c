"""A LlamaForCausalLM's CPU decode steps in one C++ call (ops/decoder.py: DecodeStepCpu).

At batch 1 a decode step's Python layer loop (~15 Python-level operations per layer: norms,
projections, views, the attention call) costs about as much as a third of the step's kernels. When
every row of a batch is a decode row, the model hands all layers to one C++ call that makes the
same kernel calls with the same arguments, so hidden states, caches and tokens are bit-identical.

Used when: the model is on the CPU, has no MoE layer, head_dim % 8 == 0, every projection is of a
kind the C++ step knows (projection_of), and, per forward call, the batch is decode-only
(meta.decode_positions set, no prefill rows) with no tensor-parallel reduce or pipeline stage and
no more rows than every projection's kernel takes. Otherwise the Python loop runs.
``LLMKERN_DECODE_STEP=0`` turns it off (read when a model builds its step, at its first forward)."""
from __future__ import annotations

import os
import warnings
from typing import Optional, Tuple

import torch

from ..layers.attention import AttnMetadata
from ..layers.kv_quant import quant_kwargs
from ..layers.linear import GEMV_ROWS, GateUpLinear, Linear
from ..layers.quant_linear import QuantGateUpLinear, QuantLinear
from ..ops.decoder import PACKED, PACKED_SILU_MUL, QUANT, QUANT_SILU_MUL, SMALL_M, DecodeStepCpu, Projection


def enabled() -> bool:
    return os.environ.get("LLMKERN_DECODE_STEP", "1") != "0"


def projection_of(lin, dtype: torch.dtype) -> Optional[Tuple[Projection, Optional[int]]]:
    """How the Python loop runs `lin` (a Linear or GateUpLinear) on a decode batch, as the C++
    step's (kind, weight, bias, in_features, out_features, silu_after), and the most rows for which
    it runs that way (None: any); None when the C++ step has no such kind (a subclass, say). A new
    kind: a branch here, mirroring the layer's __call__."""
    if type(lin) in (QuantLinear, QuantGateUpLinear):
        if len(lin.groups) != 1 or lin.weight.device.type != "cpu":
            return None
        w, layout, _, n = lin.groups[0]
        if type(lin) is QuantGateUpLinear:  # one group: the fused pair
            return (QUANT_SILU_MUL, w, None, lin.in_features, n, False, layout), None
        return (QUANT, w, lin.bias, lin.in_features, n, False, layout), None
    if type(lin) not in (Linear, GateUpLinear) or lin.weight.device.type != "cpu":
        return None
    w, b = lin.weight, lin.bias
    # a packed layout may pad in_features: the layer's own figure where it keeps one, else W's k dim
    k = getattr(lin, "in_features", None) or w.shape[1]
    gate_up = type(lin) is GateUpLinear
    if gate_up and lin.fused:  # linear_packed_silu_mul
        return (PACKED_SILU_MUL, w, None, k, lin.out_features, False, 0), None
    if lin.packed:  # linear_packed (then silu_and_mul for an unfused gate/up)
        return (PACKED, w, b, k, lin.out_features, gate_up, 0), None
    if w.dtype == dtype and w.dim() == 2:  # linear_small_m up to GEMV_ROWS rows, torch beyond
        return (SMALL_M, w, b, k, lin.out_features, gate_up, 0), GEMV_ROWS
    return None


class DecoderStep:
    """The model-side handle: which batches it takes, and the call."""

    def __init__(self, impl: DecodeStepCpu, max_rows: Optional[int]):
        self.impl = impl
        self.max_rows = max_rows

    def accepts(self, num_rows: int, meta: AttnMetadata) -> bool:
        return (meta.decode_positions is not None and not meta.num_prefill_tokens and meta.num_decode == num_rows
                and (self.max_rows is None or num_rows <= self.max_rows))

    def __call__(self, hidden: torch.Tensor, residual: torch.Tensor, meta: AttnMetadata, kv_caches) -> None:
        if not self.impl.bound_to(kv_caches):
            quants = [quant_kwargs(k) for k, _ in kv_caches]
            kind = quants[0].get("kv_cache_dtype", "auto") if quants else "auto"
            self.impl.set_kv_caches(kv_caches, kind, [(q["k_scale"], q["v_scale"]) for q in quants if q])
        self.impl.step(hidden, residual, meta.decode_positions, meta.decode_block_table)


def build_decode_step(model) -> Optional[DecoderStep]:
    """The C++ decode step over `model`'s current weights, or None where it does not apply."""
    c = model.config
    if not enabled() or model.device.type != "cpu" or c.head_dim % 8 or not model.layers:
        return None
    max_rows: Optional[int] = None
    layers = []
    for L in model.layers:
        if L.moe is not None or L.gate_up is None:
            return None
        if L.q_norm is not None and L.q_norm.eps != L.k_norm.eps:
            return None
        projs = [projection_of(lin, model.dtype) for lin in (L.qkv, L.o, L.gate_up, L.down)]
        if any(p is None for p in projs):
            return None
        for _, rows in projs:
            if rows is not None:
                max_rows = rows if max_rows is None else min(max_rows, rows)
        qk = None if L.q_norm is None else (L.q_norm.weight, L.k_norm.weight, L.q_norm.eps)
        layers.append(((L.input_norm.weight, L.input_norm.eps), (L.post_norm.weight, L.post_norm.eps), qk,
                       *(p for p, _ in projs)))
    try:
        impl = DecodeStepCpu(c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, model.rotary.cos,
                             model.rotary.sin, model.scale, model.window)
        for args in layers:
            impl.add_layer(*args)
    except (ValueError, TypeError) as e:  # weights in a layout the step did not expect: keep the loop
        warnings.warn(f"llmkern: the one-call CPU decode step is off for this model ({e})", RuntimeWarning)
        return None
    return DecoderStep(impl, max_rows)
