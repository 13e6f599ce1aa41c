"""Layer ops of a decoder (vLLM signatures) -> csrc/layernorm/: rms_norm, fused_add_rms_norm,
silu_and_mul.

Rows are the leading dimensions flattened ([..., hidden]); the last dimension must be contiguous.
Statistics are computed in fp32 for every dtype, as HF and vLLM do; ``x * rsqrt(mean(x^2) + eps)``
is rounded to the storage dtype before the weight multiply (HF's order).
"""
from __future__ import annotations

import torch

from .._args import float_arg
from .._backend import dl, kernel_op, lib_for, require_tensor, stream_of

__all__ = ["rms_norm", "fused_add_rms_norm", "silu_and_mul"]


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """[..., n] -> a [rows, n] view of the same memory (in-place ops must not write a copy)."""
    require_tensor(t, name)
    if t.dim() == 2:
        return t
    if t.dim() < 1:
        raise ValueError(f"{name}: expected a tensor [..., hidden], got a scalar")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}: the leading dimensions must flatten to rows without a copy "
                         f"(shape {tuple(t.shape)}, strides {t.stride()})") from None


@kernel_op("rms_norm", mutates_args=("out",))
def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    """``out = input * rsqrt(mean(input^2, -1) + epsilon) * weight``; out may be input (in place) but
    must not partially overlap it or overlap weight."""
    x = _rows(input, "input")
    o = _rows(out, "out")
    require_tensor(weight, "weight")
    lib_for(x).rms_norm(dl(o), dl(x), dl(weight), float_arg(epsilon, "epsilon"), stream_of(x))


@kernel_op("fused_add_rms_norm", mutates_args=("input", "residual"))
def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    """In place, as a decoder layer's residual stream needs it: ``residual += input``, then
    ``input = rms_norm(residual) * weight``. input, residual and weight must not share memory."""
    x = _rows(input, "input")
    r = _rows(residual, "residual")
    require_tensor(weight, "weight")
    lib_for(x).fused_add_rms_norm(dl(x), dl(r), dl(weight), float_arg(epsilon, "epsilon"), stream_of(x))


@kernel_op("silu_and_mul", mutates_args=("out",))
def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    """``out = silu(input[..., :d]) * input[..., d:]`` with ``d = input.shape[-1] // 2`` (the gated
    MLP of Llama after one fused gate/up matmul). out must not overlap input."""
    x = _rows(input, "input")
    o = _rows(out, "out")
    lib_for(x).silu_and_mul(dl(o), dl(x), stream_of(x))


# The same three ops for a runtime's hot path: 2-D rows in their final form, no Python-side checks
# (the kernels check every argument and raise the same errors by name; at batch 1 the wrappers'
# checks cost about as much as the kernels).
def rms_norm_rows(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    lib_for(input).rms_norm(dl(out), dl(input), dl(weight), epsilon, stream_of(input))


def fused_add_rms_norm_rows(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    lib_for(input).fused_add_rms_norm(dl(input), dl(residual), dl(weight), epsilon, stream_of(input))


def silu_and_mul_rows(out: torch.Tensor, input: torch.Tensor) -> None:
    lib_for(input).silu_and_mul(dl(out), dl(input), stream_of(input))


@rms_norm.op.register_fake
def _(out, input, weight, epsilon):
    return None


@fused_add_rms_norm.op.register_fake
def _(input, residual, weight, epsilon):
    return None


@silu_and_mul.op.register_fake
def _(out, input):
    return None
