"""Weight-only quantised projections (GGUF formats) -> csrc/linear/linear_quant{.cpp,_cpu.cpp,.cu}.

- ``pack_quant_weight(raw, qtype, out_features, in_features)``: a GGUF-quantised weight (its bytes
  as stored: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) -> ``(weight_q, layout)``, the kernels' packed panels
  (csrc/linear/quant_layout.h). 4-bit formats stay 4-bit; Q5_K, Q6_K and Q8_0 take a byte per code.
- ``linear_quant(x, weight_q, out_features, layout, bias)``: ``F.linear(x, W, bias)`` with W
  dequantised inside the kernel; x float32 or bfloat16 (CPU: x quantised to int8 per 32 k values,
  integer dot products with AVX512-VNNI where the CPU has it).
- ``pack_quant_gate_up`` + ``linear_quant_silu_mul``: the MLP's gate/up pair with the gated SiLU.
- ``quant_weight_rows``: dequantised rows (the embedding lookup of a tied quantised head).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._args import int_arg, optional_tensor
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["pack_quant_weight", "pack_quant_gate_up", "linear_quant", "linear_quant_silu_mul", "quant_weight_rows"]
# Host-side packers (numpy, at load time), not kernels: no torch.library registration.
PACKERS = ("pack_quant_weight", "pack_quant_gate_up")

PANEL = 16
LAYOUTS = {(4, 32): 0, (8, 32): 1, (8, 16): 2}  # (bits, block) -> layout id (quant_layout.h)
_FP16_MAX = 65504.0


def _panels(dec, rows: int):
    """Decoded rows (gguf_blocks.Decoded) -> uint8 [ceil(rows / 16), K / block, block_bytes] (quant_layout.h)."""
    import numpy as np

    cols = dec.codes.shape[1]
    B, nb, P = dec.block, cols // dec.block, -(-rows // PANEL)
    if max(np.abs(dec.scale).max(initial=0), np.abs(dec.offset).max(initial=0)) > _FP16_MAX:
        raise ValueError("weight: a block scale is beyond fp16's range; load this model with quantization=None")
    pad = P * PANEL - rows
    codes = np.pad(dec.codes, ((0, pad), (0, 0)))
    d = np.pad(dec.scale, ((0, pad), (0, 0))).astype(np.float16)
    m = np.pad(dec.offset, ((0, pad), (0, 0))).astype(np.float16)
    G = B // 4
    u = codes.reshape(P, PANEL, nb, G, 4)  # [panel, f, sub-block, group, e]
    if dec.bits == 4:  # chunk c: group c in the low nibbles, group c + G/2 in the high ones
        u = u[:, :, :, :G // 2] | (u[:, :, :, G // 2:] << 4)
    code_bytes = u.transpose(0, 2, 3, 1, 4).reshape(P, nb, -1)  # [panel, sub-block, group, f, e]
    scales = np.stack([d.reshape(P, PANEL, nb), m.reshape(P, PANEL, nb)], axis=2)  # [panel, f, 2, nb]
    scale_bytes = np.ascontiguousarray(scales.transpose(0, 3, 2, 1)).view(np.uint8).reshape(P, nb, 4 * PANEL)
    return np.concatenate([code_bytes, scale_bytes], axis=2)


def _check_shape(out_features, in_features):
    n, k = int_arg(out_features, "out_features"), int_arg(in_features, "in_features")
    if n <= 0 or k <= 0:
        raise ValueError(f"out_features, in_features: must be positive, got {n}, {k}")
    return n, k


def _as_bytes(raw):
    import numpy as np

    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().contiguous().view(torch.uint8).numpy()
    return np.asarray(raw)


def pack_quant_weight(raw, qtype, out_features: int, in_features: int, device=None) -> Tuple[torch.Tensor, int]:
    """GGUF bytes of a ``[out_features, in_features]`` weight of type ``qtype`` (ggml id or name) ->
    ``(weight_q, layout)`` for ``linear_quant``."""
    from .gguf_blocks import decode

    n, k = _check_shape(out_features, in_features)
    dec = decode(_as_bytes(raw), qtype, n, k)
    packed = torch.from_numpy(_panels(dec, n))
    return (packed if device is None else packed.to(device)), LAYOUTS[(dec.bits, dec.block)]


def pack_quant_gate_up(gate_raw, up_raw, qtype, out_features: int, in_features: int, up_qtype=None,
                       device=None) -> Tuple[torch.Tensor, int]:
    """The MLP's gate and up weights -> interleaved panels (gate panel i at 2i, up at 2i + 1) for
    ``linear_quant_silu_mul``. Both must decode to the same layout (a Q4_K gate with a Q6_K up: pack
    them apart)."""
    import numpy as np

    from .gguf_blocks import decode

    n, k = _check_shape(out_features, in_features)
    g = decode(_as_bytes(gate_raw), qtype, n, k)
    u = decode(_as_bytes(up_raw), qtype if up_qtype is None else up_qtype, n, k)
    if (g.bits, g.block) != (u.bits, u.block):
        raise ValueError("up: its format decodes to another layout than gate's; pack them as two weights")
    pg, pu = _panels(g, n), _panels(u, n)
    packed = torch.from_numpy(np.stack([pg, pu], axis=1).reshape(2 * pg.shape[0], *pg.shape[1:]))
    return (packed if device is None else packed.to(device)), LAYOUTS[(g.bits, g.block)]


def _x_out(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, in_features], got shape {tuple(x.shape)}")
    return torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)


@kernel_op("linear_quant")
def linear_quant(x: torch.Tensor, weight_q: torch.Tensor, out_features: int, layout: int,
                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for ``(weight_q, layout) = pack_quant_weight(...)`` of W, x ``[rows, in_features]``."""
    require_tensor(x, "x")
    require_tensor(weight_q, "weight_q")
    optional_tensor(bias, "bias")
    n = int_arg(out_features, "out_features")
    out = _x_out(x, max(n, 0))
    lib_for(x).linear_quant(dl(x), dl(weight_q), n, int_arg(layout, "layout"), dl(bias), dl(out), stream_of(x))
    return out


@linear_quant.op.register_fake
def _(x, weight_q, out_features, layout, bias=None):
    return x.new_empty(x.shape[0], out_features)


@kernel_op("linear_quant_silu_mul")
def linear_quant_silu_mul(x: torch.Tensor, weight_q: torch.Tensor, out_features: int, layout: int) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` for ``(weight_q, layout) = pack_quant_gate_up(...)``."""
    require_tensor(x, "x")
    require_tensor(weight_q, "weight_q")
    n = int_arg(out_features, "out_features")
    out = _x_out(x, max(n, 0))
    lib_for(x).linear_quant_silu_mul(dl(x), dl(weight_q), n, int_arg(layout, "layout"), dl(out), stream_of(x))
    return out


@linear_quant_silu_mul.op.register_fake
def _(x, weight_q, out_features, layout):
    return x.new_empty(x.shape[0], out_features)


@kernel_op("quant_weight_rows")
def quant_weight_rows(weight_q: torch.Tensor, out_features: int, layout: int, indices: torch.Tensor,
                      in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows ``indices [T]`` of the dequantised weight -> ``[T, in_features]`` in ``dtype`` (float32 or bfloat16)."""
    require_tensor(weight_q, "weight_q")
    require_tensor(indices, "indices")
    k = int_arg(in_features, "in_features")
    idx = indices.reshape(-1)
    out = torch.empty(idx.shape[0], max(k, 0), dtype=dtype, device=weight_q.device)
    lib_for(weight_q).quant_weight_rows(dl(weight_q), int_arg(out_features, "out_features"), int_arg(layout, "layout"),
                                        dl(idx), dl(out), stream_of(weight_q))
    return out


@quant_weight_rows.op.register_fake
def _(weight_q, out_features, layout, indices, in_features, dtype=torch.float32):
    return weight_q.new_empty(indices.numel(), in_features, dtype=dtype)
