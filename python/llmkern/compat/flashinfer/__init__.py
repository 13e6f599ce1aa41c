"""FlashInfer-compatible kernels: ``import llmkern.compat.flashinfer as flashinfer`` in place of
``import flashinfer`` (the sampling API of FlashInfer 0.6.x; see :mod:`.sampling`)."""
from . import sampling
from .sampling import *  # noqa: F401,F403  (FlashInfer re-exports its sampling ops at top level)

__all__ = ["sampling", *sampling.__all__]
