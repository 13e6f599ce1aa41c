"""Tensor, pipeline and hybrid parallelism give the single-process engine's greedy tokens, token for
token, on tiny random Llama and Qwen2 checkpoints, under a workload with prefix-cache hits,
preemption (swap with a host offload tier for Llama, recompute for Qwen2), chunked prefill and
n-gram speculation. Each rank is its own process on loopback with one thread."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams

from distributed_helpers import PROMPTS, engine_kwargs, make_model, one_thread, worker_children

PARAMS = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dist_models"))
    return {arch: make_model(root, arch) for arch in ("llama", "qwen2", "llama_kv3")}


@pytest.fixture(scope="module")
def reference(models):
    out = {}
    with one_thread():
        for arch, path in models.items():
            llm = LLM(path, **engine_kwargs(arch))
            toks = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
            m = llm.run_metrics()
            # the workload does what it is meant to
            assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0, m
            assert m["speculative"]["draft_tokens"] > 0
            if arch.startswith("llama"):
                assert m["blocks_swapped_out"] > 0 and m["blocks_offloaded"] > 0, m
            out[arch] = toks
    return out


CASES = [(arch, tp, pp) for arch in ("llama", "qwen2") for tp, pp in ((2, 1), (1, 2), (2, 2))]


@pytest.mark.parametrize("arch,tp,pp", CASES + [("llama_kv3", 2, 1)],
                         ids=[f"{a}-T{t}xP{p}" for a, t, p in CASES + [("llama_kv3", 2, 1)]])
def test_greedy_tokens_identical(arch, tp, pp, models, reference):
    llm = LLM(models[arch], tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_timeout_s=120,
              **engine_kwargs(arch))
    try:
        assert len(worker_children()) == tp * pp - 1
        toks = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        assert toks == reference[arch]
        m = llm.run_metrics()
        assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0 and m["speculative"]["draft_tokens"] > 0
        pool = llm.engine.kv.pool
        assert pool.num_used == 0 and pool.num_free == pool.num_blocks  # no block leaked
    finally:
        llm.shutdown()
    assert worker_children() == []


@pytest.fixture(scope="module")
def reference_plain(models):
    """The single-process engine without speculation (the pipeline keeps micro-batches in flight
    only then)."""
    kw = {k: v for k, v in engine_kwargs("llama").items() if k != "speculative"}
    with one_thread():
        llm = LLM(models["llama"], **kw)
        return [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)], ids=["T1xP2", "T2xP2"])
def test_pipeline_keeps_micro_batches_in_flight(tp, pp, models, reference_plain):
    """P micro-batches in the pipeline at once (no stage idles while another works), with
    preemption, prefix hits and chunked prefill still giving the single-process tokens; a request
    aborted while its step is in flight frees its blocks and the others are unaffected."""
    kw = {k: v for k, v in engine_kwargs("llama").items() if k != "speculative"}
    llm = LLM(models["llama"], tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_timeout_s=120, **kw)
    try:
        eng = llm.engine
        toks = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        assert toks == reference_plain
        assert eng.max_inflight == pp
        m = llm.run_metrics()
        assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0
        ids = [eng.add_request(p, PARAMS) for p in PROMPTS[:3]]
        while not eng._inflight:
            eng.step()
        victim = eng._inflight[-1].batch.decodes + eng._inflight[-1].batch.prefills
        rid = victim[0].request.request_id
        assert eng.abort(rid)
        done = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                done[o.request_id] = o
        assert done[rid].outputs[0].finish_reason == "abort"
        for i, r in enumerate(ids):
            if r != rid:
                assert done[r].outputs[0].token_ids == reference_plain[i]
        pool = eng.kv.pool
        assert pool.num_used == 0 and pool.num_free == pool.num_blocks  # no block leaked
    finally:
        llm.shutdown()
    assert worker_children() == []
