"""Greedy tokens of the engine == HF transformers on tiny random Llama / Qwen2 / Mistral models,
under every cache and scheduling mode: prefix caching on/off, chunked prefill on/off, a KV pool
small enough to force preemption (recompute and swap), and the CPU offload tier."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
pytest.importorskip("transformers", reason="the runtime needs transformers (the GPU check machine has only torch)")
from llmkern import LLM, SamplingParams
from runtime_helpers import hf_greedy, tiny_hf_model

NEW = 12
MODELS = {
    "llama3-rope-gqa": ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2-bias-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "mistral-window": ("mistral", dict(sliding_window=24, head_dim=16)),
}


def _prompts():
    rng = random.Random(0)
    shared = [rng.randrange(3, 256) for _ in range(21)]   # a common prefix (> 1 block)
    ps = [shared + [rng.randrange(3, 256) for _ in range(rng.randrange(1, 20))] for _ in range(4)]
    ps += [[rng.randrange(3, 256) for _ in range(rng.randrange(2, 40))] for _ in range(3)]
    return ps


@pytest.fixture(scope="module", params=list(MODELS))
def tiny(request, tmp_path_factory):
    arch, kw = MODELS[request.param]
    path = str(tmp_path_factory.mktemp(request.param))
    hf = tiny_hf_model(path, arch, **kw)
    prompts = _prompts()
    return path, prompts, hf_greedy(hf, prompts, NEW)


MODES = {
    "default": dict(),
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "no-chunked-prefill": dict(enable_chunked_prefill=False),
    "small-budget-chunks": dict(max_num_batched_tokens=7, block_size=4),
    "preempt-recompute": dict(num_gpu_blocks=20, block_size=4, preemption_mode="recompute"),
    "preempt-swap": dict(num_gpu_blocks=20, block_size=4, preemption_mode="swap", num_swap_blocks=64),
    "offload": dict(num_gpu_blocks=24, block_size=4, num_cpu_offload_blocks=64, max_num_seqs=2),
    "static": dict(scheduler="static", max_num_seqs=3),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_matches_hf(tiny, mode):
    path, prompts, ref = tiny
    llm = LLM(path, **{"num_gpu_blocks": 256, **MODES[mode]})
    sp = SamplingParams(temperature=0, max_tokens=NEW, min_tokens=NEW)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    assert all(o.finish_reason == "length" for o in outs)
    m = llm.run_metrics()
    # Run again: prefix caching serves the prompts now (and the offload tier brings blocks back).
    outs2 = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.token_ids for o in outs2] == ref
    m2 = llm.run_metrics()
    kv = llm.engine.kv
    assert kv.pool.num_used == 0, "blocks leaked"
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    if mode.startswith("preempt"):
        assert m["preemptions"] > 0
    if mode == "preempt-swap":
        assert m["blocks_swapped_out"] > 0 and m["blocks_swapped_in"] == m["blocks_swapped_out"]
    if mode == "offload":
        assert m2["blocks_offloaded"] > 0 and m2["blocks_restored"] > 0
    if mode != "no-prefix-cache":
        assert m2["prefix_hit_tokens"] > m["prefix_hit_tokens"]
    else:
        assert m2["prefix_hit_tokens"] == 0
