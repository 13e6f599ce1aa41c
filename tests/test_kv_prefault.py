"""KV prefault (kvcache/prefault.py): the CPU cache's pages become resident without their contents
changing, and the server turns it on by default."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")

from llmkern.engine.config import EngineConfig
from llmkern.kvcache import alloc_caches
from llmkern.kvcache.prefault import populate
from llmkern.models.hugepages import mapping_kib


def resident_kib(t: torch.Tensor) -> int:
    rss = mapping_kib(t).get("Rss")
    if rss is None:
        pytest.skip("no /proc/self/smaps")
    return rss


def test_pages_become_resident_and_contents_survive():
    caches = alloc_caches(512, 16, 2, 4, 64, torch.float32, "cpu")   # 2 layers, 32 MiB in all
    tensors = [t for kv in caches for t in kv]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    tensors[1][3].fill_(7.0)          # a block written before
    lazy = resident_kib(tensors[0])
    why = populate(tensors)
    if why:
        pytest.skip(f"this kernel has no MADV_POPULATE_WRITE ({why})")
    assert lazy < 0.5 * nbytes / 1024 <= 0.95 * nbytes / 1024 <= resident_kib(tensors[0])
    assert torch.all(tensors[1][3] == 7.0)
    assert torch.count_nonzero(tensors[0]) == 0 and torch.count_nonzero(tensors[3]) == 0


def test_engine_outputs_unchanged_with_prefault():
    from llmkern import LLM, SamplingParams
    from serve_helpers import require_default_model

    require_default_model()
    sp = SamplingParams(max_tokens=12, temperature=0)
    prompts = ["The capital of France is", "def fib(n):"]
    ref = [o.outputs[0].token_ids for o in LLM(kv_cache_memory_gb=0.25).generate(prompts, sp, use_tqdm=False)]
    llm = LLM(kv_cache_memory_gb=0.25, kv_prefault=True)
    k = llm.engine.kv.caches[0][0]
    assert resident_kib(k) >= 0.95 * 0.25 * 2**20 or populate([k]) is not None   # resident before any request
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert got == ref


def test_config_and_serve_flag():
    from llmkern.serve.command_args import serve_engine_kwargs, serve_parser

    with pytest.raises(ValueError, match="kv_prefault"):
        EngineConfig(kv_prefault="yes")
    assert serve_engine_kwargs(serve_parser().parse_args([]))["kv_prefault"] is True
    assert serve_engine_kwargs(serve_parser().parse_args(["--no-kv-prefault"]))["kv_prefault"] is False
