"""Fault isolation with pipeline parallelism (two stages, two micro-batches in flight): a request
whose step work raises fails alone, the steps still in the pipeline complete first, and every
other request gets the single-process engine's tokens."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams
from llmkern.engine.faults import FaultInjector

from distributed_helpers import PROMPTS, make_model, one_thread, worker_children

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
KW = dict(block_size=4, num_gpu_blocks=64, max_num_seqs=6, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("dist_iso")), "llama")


@pytest.fixture(scope="module")
def reference(model):
    with one_thread():
        return [o.token_ids for o in LLM(model, **KW).generate(PROMPTS, PARAMS, use_tqdm=False)]


def test_pipeline_fault_fails_only_its_request(model, reference):
    llm = LLM(model, pipeline_parallel_size=2, distributed_timeout_s=120, **KW)
    try:
        eng = llm.engine
        for phase, after in [("prepare", 0), ("forward", 3), ("sample", 4), ("sample", 0)]:
            ids = [eng.add_request(p, PARAMS) for p in PROMPTS]
            victim = ids[2]
            done, steps = {}, 0
            while eng.has_unfinished_requests():
                if steps == after:   # later: micro-batches are in flight when it hits
                    eng.faults = FaultInjector(f"{phase}:^{victim}$")
                for o in eng.step():
                    done[o.request_id] = o
                steps += 1
                assert steps < 400
            eng.faults = None
            assert done[victim].finish_reason == "error" and f"{phase} phase" in done[victim].error, phase
            for i, r in enumerate(ids):
                if r != victim:
                    assert done[r].error is None and done[r].token_ids == reference[i], (phase, i)
            pool = eng.kv.pool
            assert pool.num_used == 0 and pool.num_free == pool.num_blocks, "a KV block leaked"
        assert eng.max_inflight == 2
    finally:
        llm.shutdown()
    assert worker_children() == []
