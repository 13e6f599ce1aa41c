"""CPU projections y = x W^T + b -> csrc/linear/.

- ``linear_small_m``: a few rows of x (decode steps) on W as it is. Those matmuls are
  matrix-vector products bound by reading W once; the kernel streams each weight row once for all
  rows of x.
- ``pack_linear_weight`` + ``linear_packed``: any number of rows on W packed once at load time into
  16-feature panels (csrc/linear/gemm_cpu.h), a register-tiled fp32 GEMM that reads W once per call.
  For the small row counts of batched decode (8-64) it runs ~2x torch's (MKL) sgemm.
  ``packed_weight_rows`` reads rows back out of a packed W (a tied embedding's lookup).
- ``pack_gate_up_weight`` + ``linear_packed_silu_mul``: the MLP's gate/up projection with the gated
  SiLU as the GEMM's epilogue, ``silu(x Wg^T) * (x Wu^T)`` in one call (the ``[rows, 2 * inter]``
  intermediate is never written); bit-identical to ``linear_packed`` on ``[Wg; Wu]`` followed by
  ``silu_and_mul`` when inter is a multiple of 16.
- ``pack_linear_weight_bf16`` / ``pack_gate_up_weight_bf16``: the same panels in bf16 with k in pairs
  (``[panels, ceil(in_features / 2), 16, 2]``, csrc/linear/gemm_bf16_cpu.h); ``linear_packed``,
  ``linear_packed_silu_mul`` and ``packed_weight_rows`` take them for bf16 x: fp32 accumulation
  (AVX512_BF16 dot products where the CPU has them), bf16 output rounded once.

CUDA tensors go to torch (cuBLAS) in linear_small_m; the packed layout is CPU-only."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .._args import int_arg, optional_tensor
from .. import _C
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["linear_small_m", "pack_linear_weight", "linear_packed", "packed_weight_rows", "pack_gate_up_weight",
           "linear_packed_silu_mul", "pack_linear_weight_bf16", "pack_gate_up_weight_bf16"]

MAX_ROWS = 16
PANEL = 16  # output features per packed panel


@kernel_op("linear_small_m")
def linear_small_m(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` for ``x [rows <= 16, in_features]``.

    fp32 / fp16 / bf16 with fp32 accumulation; weight rows must be contiguous."""
    require_tensor(x, "x")
    require_tensor(weight, "weight")
    optional_tensor(bias, "bias")
    if x.is_cuda:
        return F.linear(x, weight, bias)
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, in_features], got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D tensor [out_features, in_features], got shape {tuple(weight.shape)}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    lib_for(x).linear_small_m(dl(x), dl(weight), dl(bias), dl(out), stream_of(x))
    return out


def linear_small_m_into(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``linear_small_m`` into ``out [rows, out_features]`` for a runtime's hot path: CPU tensors in
    their final form, no Python-side checks (at batch 1 they cost as much as the GEMV's
    scheduling; the kernel checks every argument and raises the same errors by name)."""
    _C.linear_small_m(dl(x), dl(weight), dl(bias), dl(out), 0)
    return out


@linear_small_m.op.register_fake
def _(x, weight, bias=None):
    return x.new_empty(x.shape[0], weight.shape[0])


@kernel_op("pack_linear_weight")
def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out_features, in_features]`` -> fp32 panels ``[ceil(out_features / 16), in_features, 16]``
    for ``linear_packed``: panel p holds output features 16p..16p+15, k-major, zero-padded."""
    require_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D tensor [out_features, in_features], got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"weight: expected a floating-point tensor, got {weight.dtype}")
    if weight.is_cuda:
        raise ValueError("weight: the packed layout is for the CPU GEMM; pass a CPU tensor")
    n, k = weight.shape
    w = weight.float()
    pad = -n % PANEL
    if pad:
        w = torch.cat([w, w.new_zeros(pad, k)])
    return w.view(w.shape[0] // PANEL, PANEL, k).transpose(1, 2).contiguous()


@pack_linear_weight.op.register_fake
def _(weight):
    return weight.new_empty(-(-weight.shape[0] // PANEL), weight.shape[1], PANEL, dtype=torch.float32)


def _out_features(weight_packed: torch.Tensor, out_features) -> int:
    """out_features as an int that the packed panels can hold: checked before anything is allocated."""
    n = int_arg(out_features, "out_features")
    if weight_packed.dim() in (3, 4) and n > weight_packed.shape[0] * PANEL:
        raise ValueError(f"weight_packed: {weight_packed.shape[0]} panels hold at most {weight_packed.shape[0] * PANEL} "
                         f"output features, got out_features={n}")
    return n


@kernel_op("linear_packed")
def linear_packed(x: torch.Tensor, weight_packed: torch.Tensor, out_features: int,
                  bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``weight_packed = pack_linear_weight(weight)`` (fp32) or
    ``pack_linear_weight_bf16(weight)`` (bf16 x, bias and output) on CPU, for ``x [rows, in_features]``
    with any number of rows."""
    require_tensor(x, "x")
    require_tensor(weight_packed, "weight_packed")
    optional_tensor(bias, "bias")
    out_features = _out_features(weight_packed, out_features)
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, in_features], got shape {tuple(x.shape)}")
    out = torch.empty(x.shape[0], max(out_features, 0), dtype=x.dtype, device=x.device)
    lib_for(x).linear_packed(dl(x), dl(weight_packed), out_features, dl(bias), dl(out), stream_of(x))
    return out


def linear_packed_into(x: torch.Tensor, weight_packed: torch.Tensor, out_features: int,
                       bias: Optional[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``linear_packed`` into ``out [rows, out_features]`` for a runtime's hot path (CPU tensors in
    their final form; the kernel checks every argument by name). For bf16 ``x``, ``out`` may be fp32:
    it then holds the bf16 results, widened as they are written (``linear_packed(...).float()``
    without the pass over the output: the LM head's logits)."""
    _C.linear_packed(dl(x), dl(weight_packed), int(out_features), dl(bias), dl(out), 0)
    return out


@linear_packed.op.register_fake
def _(x, weight_packed, out_features, bias=None):
    return x.new_empty(x.shape[0], out_features)


@kernel_op("pack_gate_up_weight")
def pack_gate_up_weight(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate``, ``up [inter, in_features]`` -> fp32 panel pairs ``[2 * ceil(inter / 16), in_features, 16]``
    for ``linear_packed_silu_mul``: ``pack_linear_weight`` of each, gate panel i at 2i, up panel i at 2i + 1."""
    require_tensor(gate, "gate")
    require_tensor(up, "up")
    if gate.dim() != 2 or up.shape != gate.shape:
        raise ValueError(f"up: expected the shape of gate [inter, in_features] {tuple(gate.shape)}, got {tuple(up.shape)}")
    g, u = pack_linear_weight(gate), pack_linear_weight(up)
    return torch.stack([g, u], dim=1).reshape(2 * g.shape[0], g.shape[1], PANEL)


@pack_gate_up_weight.op.register_fake
def _(gate, up):
    return gate.new_empty(2 * -(-gate.shape[0] // PANEL), gate.shape[1], PANEL, dtype=torch.float32)


@kernel_op("linear_packed_silu_mul")
def linear_packed_silu_mul(x: torch.Tensor, weight_pairs: torch.Tensor, out_features: int) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` with ``weight_pairs = pack_gate_up_weight(gate, up)`` (fp32) or
    ``pack_gate_up_weight_bf16(gate, up)`` (bf16 x and output) on CPU, ``x [rows, in_features]`` ->
    ``[rows, out_features]`` (out_features = inter)."""
    require_tensor(x, "x")
    require_tensor(weight_pairs, "weight_pairs")
    n = int_arg(out_features, "out_features")
    if weight_pairs.dim() in (3, 4) and n > weight_pairs.shape[0] // 2 * PANEL:
        raise ValueError(f"weight_pairs: {weight_pairs.shape[0]} panels hold at most {weight_pairs.shape[0] // 2 * PANEL} "
                         f"gate/up output features, got out_features={n}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, in_features], got shape {tuple(x.shape)}")
    out = torch.empty(x.shape[0], max(n, 0), dtype=x.dtype, device=x.device)
    lib_for(x).linear_packed_silu_mul(dl(x), dl(weight_pairs), n, dl(out), stream_of(x))
    return out


@linear_packed_silu_mul.op.register_fake
def _(x, weight_pairs, out_features):
    return x.new_empty(x.shape[0], out_features)


@kernel_op("packed_weight_rows")
def packed_weight_rows(weight_packed: torch.Tensor, out_features: int, indices: torch.Tensor,
                       in_features: Optional[int] = None) -> torch.Tensor:
    """Rows ``indices [T]`` of the weight packed by ``pack_linear_weight`` (or ``pack_linear_weight_bf16``):
    ``weight[indices]`` ``[T, in_features]`` (the embedding lookup of a tied LM head kept only in packed
    form). ``in_features`` is required for the bf16 pairs, whose shape cannot tell an odd in_features."""
    require_tensor(weight_packed, "weight_packed")
    require_tensor(indices, "indices")
    out_features = _out_features(weight_packed, out_features)
    if weight_packed.dim() not in (3, 4):
        raise ValueError(f"weight_packed: expected [ceil(out_features / 16), in_features, 16] or bf16 pairs "
                         f"[ceil(out_features / 16), ceil(in_features / 2), 16, 2], got shape {tuple(weight_packed.shape)}")
    if in_features is None:
        if weight_packed.dim() == 4:
            raise ValueError("in_features: required for bf16 pairs (an odd in_features is padded with a zero)")
        in_features = weight_packed.shape[1]
    k = int_arg(in_features, "in_features")
    dtype = torch.bfloat16 if weight_packed.dim() == 4 else torch.float32
    out = torch.empty(indices.reshape(-1).shape[0], max(k, 0), dtype=dtype)
    lib_for(weight_packed).packed_weight_rows(dl(weight_packed), out_features, dl(indices.reshape(-1)), dl(out),
                                              stream_of(weight_packed))
    return out


@packed_weight_rows.op.register_fake
def _(weight_packed, out_features, indices, in_features=None):
    k = weight_packed.shape[1] if in_features is None else in_features
    return weight_packed.new_empty(indices.numel(), k, dtype=torch.bfloat16 if weight_packed.dim() == 4 else torch.float32)


def _check_weight(weight: torch.Tensor, name: str = "weight") -> None:
    require_tensor(weight, name)
    if weight.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor [out_features, in_features], got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {weight.dtype}")
    if weight.is_cuda:
        raise ValueError(f"{name}: the packed layout is for the CPU GEMM; pass a CPU tensor")


@kernel_op("pack_linear_weight_bf16")
def pack_linear_weight_bf16(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out_features, in_features]`` -> bf16 panels in k pairs
    ``[ceil(out_features / 16), ceil(in_features / 2), 16, 2]`` for ``linear_packed`` on bf16 x:
    ``W[16p + f, 2h + e]`` at ``[p, h, f, e]``, zero-padded (features to 16, an odd in_features to even)."""
    _check_weight(weight)
    n, k = weight.shape
    w = F.pad(weight.to(torch.bfloat16), (0, k % 2, 0, -n % PANEL))
    return w.view(w.shape[0] // PANEL, PANEL, w.shape[1] // 2, 2).transpose(1, 2).contiguous()


@pack_linear_weight_bf16.op.register_fake
def _(weight):
    return weight.new_empty(-(-weight.shape[0] // PANEL), -(-weight.shape[1] // 2), PANEL, 2, dtype=torch.bfloat16)


@kernel_op("pack_gate_up_weight_bf16")
def pack_gate_up_weight_bf16(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate``, ``up [inter, in_features]`` -> bf16 pair panels ``[2 * ceil(inter / 16), ceil(in_features / 2), 16, 2]``
    for ``linear_packed_silu_mul`` on bf16 x: ``pack_linear_weight_bf16`` of each, gate panel i at 2i, up at 2i + 1."""
    _check_weight(gate, "gate")
    _check_weight(up, "up")
    if up.shape != gate.shape:
        raise ValueError(f"up: expected the shape of gate [inter, in_features] {tuple(gate.shape)}, got {tuple(up.shape)}")
    g, u = pack_linear_weight_bf16(gate), pack_linear_weight_bf16(up)
    return torch.stack([g, u], dim=1).reshape(2 * g.shape[0], *g.shape[1:])


@pack_gate_up_weight_bf16.op.register_fake
def _(gate, up):
    return gate.new_empty(2 * -(-gate.shape[0] // PANEL), -(-gate.shape[1] // 2), PANEL, 2, dtype=torch.bfloat16)
