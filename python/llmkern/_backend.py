"""How Python reaches the kernels: backend module per tensor, DLPack capsules, CUDA streams, and
the torch.library registration helper used by every op wrapper."""
from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from typing import Callable, Optional, Sequence

import torch
from torch.utils.dlpack import to_dlpack

_to_dlpack = torch._C._to_dlpack  # what to_dlpack calls, without its Python frame

from . import _C
from ._args import raise_unsupported_device
from ._args import require_tensor  # noqa: F401  (re-exported: the ops modules import it from here)

_state = threading.local()


def simt_available() -> bool:
    try:
        importlib.import_module("llmkern._simt")
        return True
    except ImportError:
        return False


@contextlib.contextmanager
def simt_backend():
    """Route CPU tensors to the CUDA kernel sources running on the SIMT emulator (llmkern._simt).

    Used by the tests to execute every CUDA kernel on machines without a GPU."""
    mod = importlib.import_module("llmkern._simt")
    prev = getattr(_state, "lib", None)
    _state.lib = mod
    try:
        yield mod
    finally:
        _state.lib = prev


def lib_for(t: torch.Tensor):
    """The extension module that runs an op whose main tensor is `t`."""
    if not t.is_cuda:
        lib = getattr(_state, "lib", None)
        if lib is not None:
            return lib
    return _C


def dl(t: Optional[torch.Tensor], name: str = "tensor argument"):
    """A DLPack capsule for `t` (no copy, strides kept), or None. `name` is the argument's name
    for the error raised when `t` is not a tensor on a device the kernels can address."""
    if t is None:
        return None
    if type(t) is torch.Tensor and not t.requires_grad:  # the hot path: one C call (~0.2 us)
        try:
            return _to_dlpack(t)
        except BufferError:
            raise_unsupported_device(t, name)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    try:
        return to_dlpack(t.detach() if t.requires_grad else t)
    except BufferError:  # meta and other devices DLPack cannot export
        raise_unsupported_device(t, name)


def stream_of(t: torch.Tensor) -> int:
    """The caller's current CUDA stream for `t`'s device (0 for CPU tensors)."""
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream
    return 0


def kernel_op(name: str, mutates_args: Sequence[str] = ()) -> Callable:
    """Register `fn` as the torch.library custom op llmkern::<name>.

    Eager calls go straight to `fn` (no dispatcher overhead on the hot path); under
    torch.compile the registered op is traced, with the fake implementation registered through
    `wrapper.op.register_fake`."""

    def deco(fn: Callable) -> Callable:
        op = torch.library.custom_op(f"llmkern::{name}", mutates_args=tuple(mutates_args))(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if torch.compiler.is_compiling():
                return op(*args, **kwargs)
            return fn(*args, **kwargs)

        wrapper.op = op
        return wrapper

    return deco
