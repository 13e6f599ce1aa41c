"""Shared fixtures: the `backend` fixture runs a test on every backend present.

- cpu:  the C++ CPU kernels (always)
- simt: the CUDA kernel sources compiled by the host compiler, run on the SIMT emulator
        (always in CI: LLMKERN_REQUIRE_SIMT=1 turns a missing llmkern._simt into a failure)
- cuda: a real GPU (marker `cuda`; skipped when there is none)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

import llmkern


@dataclass(frozen=True)
class Backend:
    name: str
    device: str

    @property
    def emulated(self) -> bool:
        return self.name == "simt"


BACKENDS = ["cpu", "simt", pytest.param("cuda", marks=pytest.mark.cuda)]


def _enter(name: str):
    if name == "simt":
        if not llmkern.simt_available():
            if os.environ.get("LLMKERN_REQUIRE_SIMT") == "1":
                pytest.fail("llmkern._simt is not built (install with LLMKERN_SIMT=ON)")
            pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
        return llmkern.simt_backend(), Backend("simt", "cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
        if "cuda" not in llmkern.build_info()["backends"]:
            pytest.fail("a GPU is present but llmkern was built without CUDA")
        return None, Backend("cuda", "cuda")
    return None, Backend("cpu", "cpu")


@pytest.fixture(params=BACKENDS)
def backend(request):
    ctx, b = _enter(request.param)
    if ctx is None:
        yield b
    else:
        with ctx:
            yield b


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def native_backend(request):
    """Backends with real kernels only (no emulation): for large shapes."""
    _, b = _enter(request.param)
    yield b


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
