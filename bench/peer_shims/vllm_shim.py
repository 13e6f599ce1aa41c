"""Makes the imports of vLLM's kernel tests (tests/kernels/attention/test_cache.py,
tests/kernels/core/test_layernorm.py, test_pos_encoding.py, test_rotary_embedding.py and the MoE
routing / alignment files) resolve without an installed vLLM: ``vllm._custom_ops`` is llmkern.compat.vllm_ops, ``torch.ops._C_cache_ops`` /
``torch.ops._C`` name llmkern's registered ops (their opcheck targets), and the small pieces of
vLLM's test scaffolding those files use are written here from vLLM's documented behaviour:
``current_platform.seed_everything``, ``tests.kernels.utils.opcheck``, the default tolerances,
the KV-cache factory fixtures, and the two layers whose ``forward_native`` is the tests' plain
torch reference (``RMSNorm``, ``get_rope``: forward = the compat op, forward_native = torch).
"""
from __future__ import annotations

import math
import random
import sys
import types

import torch

FP8_DTYPE = torch.float8_e4m3fn


def _module(name: str, **attrs) -> types.ModuleType:
    m = sys.modules.get(name) or types.ModuleType(name)
    m.__dict__.update(attrs)
    if "." not in name:
        m.__path__ = []  # a package, so that submodules resolve
    sys.modules[name] = m
    parent, _, leaf = name.rpartition(".")
    if parent:
        if parent not in sys.modules:
            _module(parent)
        sys.modules[parent].__path__ = getattr(sys.modules[parent], "__path__", [])
        setattr(sys.modules[parent], leaf, m)
    return m


class _Platform:
    def seed_everything(self, seed=None):
        if seed is not None:
            random.seed(seed)
            torch.manual_seed(seed)
            try:
                import numpy as np

                np.random.seed(seed)
            except ImportError:
                pass

    def is_cpu(self):  # the device under test is llmkern, standing in for a GPU
        return False

    def is_cuda(self):
        return True

    def is_rocm(self):
        return False

    def is_cuda_alike(self):
        return True

    def has_device_capability(self, *a, **k):
        return True

    def get_device_capability(self, *a, **k):
        return types.SimpleNamespace(major=9, minor=0, to_int=lambda: 90)

    fp8_dtype = staticmethod(lambda: FP8_DTYPE)


DEFAULT_OPCHECK_TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


def opcheck(op, args, kwargs=None, *, test_utils=DEFAULT_OPCHECK_TEST_UTILS, raise_exception=True,
            cond=True):
    if not cond:
        return {}
    return torch.library.opcheck(op, args, kwargs, test_utils=test_utils, raise_exception=raise_exception)


# vLLM's default tolerances per output dtype (tests/kernels/allclose_default.py: torch's defaults).
_ATOL = {torch.float: 1e-5, torch.half: 1e-3, torch.bfloat16: 1e-3}
_RTOL = {torch.float: 1.3e-6, torch.half: 1e-3, torch.bfloat16: 1.6e-2}


def get_default_atol(output):
    return _ATOL[output.dtype]


def get_default_rtol(output):
    return _RTOL[output.dtype]


def _fp8_only(*a, **k):
    raise NotImplementedError("fp8: llmkern has no fp8 kernels")


def set_random_seed(seed):
    _Platform().seed_everything(seed)


def requires_platform(*names):
    return lambda fn: fn  # llmkern stands in for the CUDA device the tests ask for


# vllm.ir's per-op tolerances: the default ones of the output dtype (torch's).
_ir = types.SimpleNamespace(ops=types.SimpleNamespace(rms_norm=types.SimpleNamespace(
    get_tolerance=lambda dtype: {"atol": _ATOL[dtype], "rtol": _RTOL[dtype]})))


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-6, var_hidden_size=None, has_weight=True, dtype=None):
        super().__init__()
        self.variance_epsilon = eps
        self.has_weight = has_weight
        w = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
        self.weight = torch.nn.Parameter(w) if has_weight else w

    def _w(self):
        return self.weight.data if self.has_weight else None

    def forward_native(self, x, residual=None):
        dt = x.dtype
        x = x.to(torch.float32)
        if residual is not None:
            x = x + residual.to(torch.float32)
            residual = x.to(dt)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        x = x.to(dt) * self.weight if self.has_weight else x.to(dt)
        return x if residual is None else (x, residual)

    def forward(self, x, residual=None):
        from llmkern.compat import vllm_ops as ops

        if residual is not None:
            ops.fused_add_rms_norm(x, residual, self._w(), self.variance_epsilon)
            return x, residual
        out = torch.empty_like(x)
        ops.rms_norm(out, x, self._w(), self.variance_epsilon)
        return out


class GemmaRMSNorm(torch.nn.Module):
    """Gemma's norm: weight stored as an offset from 1; forward_native keeps (1 + w) and the
    multiply in fp32 (vLLM's reference)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size))

    def forward_native(self, x, residual=None):
        dt = x.dtype
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(dt)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        x = (x * (1.0 + self.weight.float())).to(dt)
        return x if residual is None else (x, residual)

    def forward(self, x, residual=None):
        from llmkern.compat import vllm_ops as ops

        w = (1.0 + self.weight.data.float()).to(x.dtype)
        if residual is not None:
            ops.fused_add_rms_norm(x, residual, w, self.variance_epsilon)
            return x, residual
        out = torch.empty_like(x)
        ops.rms_norm(out, x, w, self.variance_epsilon)
        return out


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_size, rotary_dim, max_position, base, is_neox_style, dtype):
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, is_neox_style
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _rotate(self, x, cos, sin):
        if self.is_neox_style:
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)

    def forward_native(self, positions, query, key=None):
        # vLLM's reference: the cache in the query's dtype and every product and sum rounded
        # there (not fp32), which is what its tolerances are set for.
        positions = positions.flatten()
        cache = self.cos_sin_cache.to(query.device, dtype=query.dtype)
        cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)

        def apply(x):
            shape = x.shape
            x = x.reshape(positions.numel(), -1, self.head_size)
            rot = self._rotate(x[..., : self.rotary_dim], cos, sin)
            return torch.cat((rot, x[..., self.rotary_dim:]), dim=-1).reshape(shape)

        return apply(query), (None if key is None else apply(key))

    def forward(self, positions, query, key=None):
        from llmkern.compat import vllm_ops as ops

        ops.rotary_embedding(positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox_style)
        return query, key


def get_rope(head_size, *args, **kwargs):
    """Both of vLLM's signatures: the current ``get_rope(head_size, max_position, is_neox_style,
    rope_parameters, dtype)`` (rotary_dim = head_size * partial_rotary_factor, theta inside the
    dict) and the older ``get_rope(head_size, rotary_dim, max_position, base, is_neox_style,
    rope_scaling, dtype, partial_rotary_factor)``."""
    current = "rope_parameters" in kwargs or (len(args) >= 2 and isinstance(args[1], bool)) \
        or (len(args) >= 3 and isinstance(args[2], dict))
    if current:
        names = ("max_position", "is_neox_style", "rope_parameters", "dtype")
        a = dict(zip(names, args), **kwargs)
        params = dict(a.get("rope_parameters") or {})
        if params.get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_type={params['rope_type']!r}: not part of the shim")
        rotary_dim = int(head_size * params.get("partial_rotary_factor", 1.0))
        return RotaryEmbedding(head_size, rotary_dim, a["max_position"], params.get("rope_theta", 10000),
                               a.get("is_neox_style", True), a.get("dtype") or torch.get_default_dtype())
    names = ("rotary_dim", "max_position", "base", "is_neox_style", "rope_scaling", "dtype")
    a = dict(zip(names, args), **kwargs)
    if a.get("rope_scaling") is not None:
        raise NotImplementedError("rope_scaling: not part of the shim")
    return RotaryEmbedding(head_size, a["rotary_dim"], a["max_position"], a["base"], a.get("is_neox_style", True),
                           a.get("dtype") or torch.get_default_dtype())


def _random_caches_flash(num_blocks, block_size, num_layers, num_heads, head_size, cache_dtype,
                         model_dtype=None, seed=None, device="cpu", cache_layout="NHD"):
    """vLLM's flash layout: per layer a [num_blocks, 2, block_size, heads, head] allocation in
    NHD or HND memory order; key/value caches are its [:, 0] / [:, 1] views."""
    if cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype={cache_dtype!r}: llmkern caches are 'auto' only")
    if seed is not None:
        _Platform().seed_everything(seed)
    dtype = model_dtype
    order = (0, 1, 2, 3, 4) if cache_layout in ("NHD", "NHC") else (0, 1, 3, 2, 4)
    generic = (num_blocks, 2, block_size, num_heads, head_size)
    alloc = tuple(generic[i] for i in order)
    inv = [order.index(i) for i in range(5)]
    scale = head_size ** -0.5
    keys, values = [], []
    for _ in range(num_layers):
        kv = torch.empty(alloc, dtype=dtype, device=device).permute(*inv)
        kv.uniform_(-scale, scale)
        keys.append(kv[:, 0])
        values.append(kv[:, 1])
    return keys, values


def _random_caches(num_blocks, block_size, num_layers, num_heads, head_size, cache_dtype,
                   model_dtype=None, seed=None, device="cpu"):
    """vLLM's older paged layout: key [blocks, heads, head/x, block, x], value [blocks, heads,
    head, block] (x = 16 bytes of elements)."""
    if cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype={cache_dtype!r}: llmkern caches are 'auto' only")
    if seed is not None:
        _Platform().seed_everything(seed)
    dtype = model_dtype
    x = 16 // torch.tensor([], dtype=dtype).element_size()
    scale = head_size ** -0.5
    keys = [torch.empty(num_blocks, num_heads, head_size // x, block_size, x, dtype=dtype,
                        device=device).uniform_(-scale, scale) for _ in range(num_layers)]
    values = [torch.empty(num_blocks, num_heads, head_size, block_size, dtype=dtype,
                          device=device).uniform_(-scale, scale) for _ in range(num_layers)]
    return keys, values


def install() -> None:
    from llmkern.compat import vllm_ops

    _module("vllm", _custom_ops=vllm_ops)
    sys.modules["vllm._custom_ops"] = vllm_ops
    _module("vllm.platforms", current_platform=_Platform())
    _module("vllm.model_executor.layers.layernorm", RMSNorm=RMSNorm, GemmaRMSNorm=GemmaRMSNorm)
    _module("vllm.ir", ops=_ir.ops)
    _module("vllm.utils.torch_utils", set_random_seed=set_random_seed, nvfp4_kv_cache_split_views=_fp8_only)
    _module("vllm.model_executor.layers.quantization.utils.quant_utils", scaled_dequantize=_fp8_only)
    _module("vllm.v1.attention.ops.triton_reshape_and_cache_flash",
            triton_reshape_and_cache_flash=vllm_ops.reshape_and_cache_flash)
    _module("tests.utils", requires_platform=requires_platform)
    import vllm_moe_shim

    vllm_moe_shim.install(_module)
    _module("vllm.model_executor.layers.rotary_embedding", get_rope=get_rope, RotaryEmbedding=RotaryEmbedding)
    _module("tests.kernels.utils", opcheck=opcheck, DEFAULT_OPCHECK_TEST_UTILS=DEFAULT_OPCHECK_TEST_UTILS,
            fp8_allclose=_fp8_only, fp8_ulp_distance=_fp8_only)
    _module("tests.kernels.allclose_default", get_default_atol=get_default_atol, get_default_rtol=get_default_rtol)
    _module("tests.kernels.quant_utils", FP8_DTYPE=FP8_DTYPE)
    names = {n: getattr(vllm_ops, n).op for n in vllm_ops.__all__ if hasattr(getattr(vllm_ops, n), "op")}
    ns = types.SimpleNamespace(**names)
    torch.ops._C_cache_ops = ns
    torch.ops._C = ns



def fixtures() -> dict:
    """The KV-cache fixtures of vLLM's tests/conftest.py (the conftest adds them to its globals)."""
    import pytest

    @pytest.fixture
    def kv_cache_factory():
        return _random_caches

    @pytest.fixture
    def kv_cache_factory_flashinfer():
        return _random_caches_flash

    @pytest.fixture
    def default_vllm_config():
        yield None  # the kernels under test read no vLLM config

    @pytest.fixture
    def dist_init():
        yield None  # single process: nothing to initialise

    return {"kv_cache_factory": kv_cache_factory, "kv_cache_factory_flashinfer": kv_cache_factory_flashinfer,
            "default_vllm_config": default_vllm_config, "dist_init": dist_init}
