"""Makes FlashInfer's imports resolve to llmkern.compat.flashinfer: ``flashinfer`` and its
``sampling`` / ``decode`` / ``prefill`` / ``page`` / ``cascade`` modules, plus stand-ins for what
its attention tests import besides the API under test: the JIT warm-up (nothing to compile
here), device queries, and the helpers under ``tests/test_helpers`` (parametrize helpers: the
full product, which --sample then draws from; fp4 helpers: fp4 is out of scope)."""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys
import types
from pathlib import Path

import pytest


def _module(name: str, **attrs) -> types.ModuleType:
    m = sys.modules.get(name) or types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = getattr(m, "__path__", [])
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent:
        setattr(sys.modules.get(parent) or _module(parent), leaf, m)
    return m


def parametrize_product(axes, values=None, *, regular=None, ids=None):
    """FlashInfer's matrix helper, as a plain full product (its regular subset is a selection of
    these cases; the runner's sampling bounds the count)."""
    if isinstance(axes, dict):
        names, values = list(axes), [list(v) for v in axes.values()]
    else:
        names = [n.strip() for n in axes.split(",")] if isinstance(axes, str) else list(axes)
    return pytest.mark.parametrize(",".join(names), list(itertools.product(*values)))


def _peer_helper(name: str, rel: str) -> None:
    """Loads one of the checkout's own pure-torch test helpers (references such as
    ref_single_prefill, closeness checks) under its package name: the tests' comparisons stay the
    peer's. Absent in older checkouts, which did not import it."""
    path = Path(os.environ.get("PEER_SUITE_CHECKOUT", ".")) / rel
    if not path.exists():
        return
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    setattr(sys.modules[name.rpartition(".")[0]], name.rpartition(".")[2], mod)


class GPUArchitectureError(RuntimeError):
    """flashinfer.utils' error for a kernel the GPU cannot run (never raised here)."""


def _none(*a, **k):
    return []


def _fp4(*a, **k):
    raise NotImplementedError("nvfp4: llmkern has no fp4 KV cache")


def install() -> None:
    try:
        fi = importlib.import_module("llmkern.compat.flashinfer")
    except ImportError as e:
        raise ImportError(f"llmkern.compat.flashinfer is not available in this build: {e}") from e
    sys.modules["flashinfer"] = fi
    for sub in ("sampling", "decode", "prefill", "page", "cascade"):
        sys.modules[f"flashinfer.{sub}"] = getattr(fi, sub)
    fi.jit = _module("flashinfer.jit", build_jit_specs=_none, parallel_load_modules=_none, has_prebuilt_ops=True)
    fi.utils = _module("flashinfer.utils", get_compute_capability=lambda *a, **k: (9, 0),
                       has_flashinfer_jit_cache=lambda: True, is_sm90a_supported=lambda *a: False,
                       is_sm100a_supported=lambda *a: False, determine_attention_backend=lambda *a: "fa2",
                       GPUArchitectureError=GPUArchitectureError)
    _module("flashinfer.cutile.cutile_common", is_cuda_tile_available=lambda: False)
    _module("tests.test_helpers.jit_utils", gen_decode_attention_modules=_none, gen_prefill_attention_modules=_none,
            jit_decode_attention_func_args=_none, jit_prefill_attention_func_args=_none)
    sys.modules["jit_utils"] = sys.modules["tests.test_helpers.jit_utils"]  # older tests' flat import
    _module("tests.test_helpers.parametrize", parametrize_product=parametrize_product,
            pairwise_product_cases=None)
    _module("tests.test_helpers.utils_fp4", create_nvfp4_kv=_fp4, nvfp4_to_float=_fp4)
    for helper in ("test_helpers", "rope_reference", "alibi_reference"):
        _peer_helper(f"tests.test_helpers.{helper}", f"tests/test_helpers/{helper}.py")
