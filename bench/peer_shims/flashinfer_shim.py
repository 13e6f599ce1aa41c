"""Makes ``import flashinfer`` / ``flashinfer.sampling`` resolve to llmkern.compat.flashinfer (the
sampling ops FlashInfer's tests/utils/test_sampling.py calls)."""
from __future__ import annotations

import importlib
import sys


def install() -> None:
    try:
        fi = importlib.import_module("llmkern.compat.flashinfer")
        sampling = importlib.import_module("llmkern.compat.flashinfer.sampling")
    except ImportError as e:
        raise ImportError(f"llmkern.compat.flashinfer is not available in this build: {e}") from e
    sys.modules["flashinfer"] = fi
    sys.modules["flashinfer.sampling"] = sampling
    if not hasattr(fi, "sampling"):
        fi.sampling = sampling
