"""llmkern: hand-written CPU and CUDA kernels for LLM inference, and a small runtime on top.

Kernels (drop-in signatures of flash-attn 2, vLLM and FlashInfer) live in ``llmkern.ops``; the
runtime's entry point is ``llmkern.LLM``.
"""
from __future__ import annotations

from . import _C
from ._backend import simt_available, simt_backend
from ._build import build_info, get_num_threads, set_num_threads
from ._errors import IndexOutOfRangeError

__version__ = _C.build_info()["version"]

from .ops import *  # noqa: E402,F401,F403  (flash_attn_varlen_func, reshape_and_cache_flash, ...)
from .cpu_affinity import cpu_share, format_cpus, set_cpu_affinity  # noqa: E402,F401
from .cpu_affinity import apply_env as _apply_cpu_env  # noqa: E402

_apply_cpu_env()


def __getattr__(name):  # the runtime is imported on first use: kernels alone stay light
    if name in ("LLM", "SamplingParams"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'llmkern' has no attribute {name!r}")
