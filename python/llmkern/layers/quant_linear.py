"""Projections whose weights stay GGUF-quantised (ops/linear_gguf.py), and the factories the model
builder calls with either a dense tensor or a ``GGUFWeight``.

A fused projection (Q/K/V) may mix formats: Q4_K_M files keep some layers' V in Q6_K beside Q4_K
queries and keys. Parts that pack to the same kernel layout share one packed weight; each group
runs one kernel call into its columns of the output."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from ..ops.gguf_blocks import CODES, FORMATS
from ..ops.linear_gguf import (LAYOUTS, linear_quant, linear_quant_silu_mul, pack_quant_gate_up, pack_quant_weight,
                                quant_weight_rows)
from .activation import silu_and_mul
from .linear import GateUpLinear, Linear


@dataclass
class GGUFWeight:
    """A [rows, cols] weight as a GGUF file stores it: ``raw`` uint8 [rows, bytes per row] of ggml type ``qtype``."""
    raw: np.ndarray
    qtype: int
    rows: int
    cols: int

    @property
    def shape(self):
        return (self.rows, self.cols)

    @property
    def layout(self) -> int:
        return LAYOUTS[CODES[FORMATS[self.qtype][0]]]

    def dequantize(self, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """The weight as quantization=None loads it (gguf-py's dequantize, as models/loader.py)."""
        from gguf.quants import dequantize

        w = np.asarray(dequantize(self.raw, self.qtype), dtype=np.float32).reshape(self.rows, self.cols)
        return torch.from_numpy(w).to(device=device, dtype=dtype)


Weight = Union[torch.Tensor, GGUFWeight]


class QuantLinear:
    """y = x W^T (+ bias) on GGUF-quantised W: one packed weight per run of parts that share a
    kernel layout, each into its columns of y."""

    __slots__ = ("groups", "bias", "out_features", "in_features", "dtype")

    def __init__(self, parts: Sequence[GGUFWeight], bias: Optional[torch.Tensor], dtype: torch.dtype, device):
        self.in_features = parts[0].cols
        self.out_features = sum(p.rows for p in parts)
        self.dtype = dtype
        self.bias = bias
        self.groups = []  # [packed uint8, layout, first column, columns]
        col, i = 0, 0
        while i < len(parts):
            j = i + 1
            while j < len(parts) and parts[j].layout == parts[i].layout:
                j += 1
            run = parts[i:j]
            rows = sum(p.rows for p in run)
            packed = [pack_quant_weight(p.raw, p.qtype, p.rows, p.cols)[0] for p in run]
            w = packed[0] if len(run) == 1 else torch.cat(packed)  # whole panels: make_linear checks
            self.groups.append([w.to(device), run[0].layout, col, rows])
            col, i = col + rows, j

    @property
    def weight(self) -> torch.Tensor:  # the single group's packed weight (decode step, tests)
        return self.groups[0][0]

    def tensors(self) -> List[Optional[torch.Tensor]]:
        return [g[0] for g in self.groups] + [self.bias]

    def set_tensors(self, ts: Sequence[Optional[torch.Tensor]]) -> None:
        for g, t in zip(self.groups, ts):
            g[0] = t
        self.bias = ts[-1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.groups) == 1:
            w, layout, _, n = self.groups[0]
            return linear_quant(x, w, n, layout, self.bias)
        width = self.groups[-1][2] + self.groups[-1][3]
        out = torch.empty(x.shape[0], width, dtype=x.dtype, device=x.device)
        for w, layout, c0, n in self.groups:
            b = None if self.bias is None else self.bias[c0:c0 + n]
            out[:, c0:c0 + n] = linear_quant(x, w, n, layout, b)
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantised weight rows `ids` (the embedding lookup of a tied quantised head)."""
        w, layout, _, n = self.groups[0]
        return quant_weight_rows(w, n, layout, ids, self.in_features, self.dtype)


class QuantGateUpLinear(QuantLinear):
    """silu(x Wg^T) * (x Wu^T) on quantised gate/up: one call with the gated SiLU as the epilogue
    when both pack to the same layout, else the pair's GEMMs then silu_and_mul."""

    __slots__ = ("fused",)

    def __init__(self, gate: GGUFWeight, up: GGUFWeight, dtype: torch.dtype, device):
        self.fused = gate.layout == up.layout
        if not self.fused:
            super().__init__([gate, up], None, dtype, device)
            self.out_features = gate.rows
            return
        self.in_features, self.out_features, self.dtype, self.bias = gate.cols, gate.rows, dtype, None
        w, layout = pack_quant_gate_up(gate.raw, up.raw, gate.qtype, gate.rows, gate.cols, up_qtype=up.qtype)
        self.groups = [[w.to(device), layout, 0, gate.rows]]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            w, layout, _, n = self.groups[0]
            return linear_quant_silu_mul(x, w, n, layout)
        return silu_and_mul(QuantLinear.__call__(self, x))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("QuantGateUpLinear: no row lookup (it is no embedding)")


# -- factories: a dense tensor gives the dense layer, a GGUFWeight the quantised one -------------
def _quantisable(w: Weight, dtype: torch.dtype, device) -> bool:
    """The kernels take fp32 and bf16 activations (fp16 models dequantise at load)."""
    return isinstance(w, GGUFWeight) and dtype in (torch.float32, torch.bfloat16) and \
        torch.device(device).type in ("cpu", "cuda")


def _dense(w: Weight, dtype: torch.dtype, device) -> torch.Tensor:
    return w.dequantize(dtype, device) if isinstance(w, GGUFWeight) else w


def make_linear(parts: Sequence[Weight], bias: Optional[torch.Tensor], dtype: torch.dtype, device):
    """One projection over the rows of `parts` (fused Q/K/V: several)."""
    if all(_quantisable(p, dtype, device) for p in parts) and all(p.rows % 16 == 0 for p in parts[:-1]):
        return QuantLinear(parts, bias, dtype, device)
    ws = [_dense(p, dtype, device) for p in parts]
    return Linear(ws[0] if len(ws) == 1 else torch.cat(ws), bias)


def make_gate_up(gate: Weight, up: Weight, dtype: torch.dtype, device):
    if _quantisable(gate, dtype, device) and _quantisable(up, dtype, device) and gate.rows % 16 == 0:
        return QuantGateUpLinear(gate, up, dtype, device)
    return GateUpLinear(_dense(gate, dtype, device), _dense(up, dtype, device))
