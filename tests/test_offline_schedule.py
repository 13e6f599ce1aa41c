"""Prompts sharing a prefix get the shared blocks computed once, with the same greedy tokens as HF:
schedule="throughput" groups them, and arrival order lets a prompt whose prefix is being computed
wait for it."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import LLM, SamplingParams
from runtime_helpers import hf_greedy, tiny_hf_model

BS = 4


def _workload():
    rng = random.Random(5)
    docs = [[rng.randrange(3, 256) for _ in range(rng.randint(9, 30))] for _ in range(3)]
    reqs = [d + [rng.randrange(3, 256) for _ in range(rng.randint(1, 6))] for d in docs for _ in range(4)]
    reqs += [[rng.randrange(3, 256) for _ in range(rng.randint(2, 12))] for _ in range(3)]
    return reqs   # grouped by document, as a script writing "for doc: for question:" lays it out


def _min_prefill_tokens(prompts):
    """Prompt tokens computed when every shareable full block (all but the one holding the last
    prompt token) is computed once: distinct block prefixes x block size + each prompt's tail."""
    seen, total = set(), 0
    for p in prompts:
        m = (len(p) - 1) // BS
        seen.update(tuple(p[:(i + 1) * BS]) for i in range(m))
        total += len(p) - m * BS
    return total + len(seen) * BS


def _count_prompt_rows(llm) -> list:
    """Counts the prompt tokens each step computes: prefill chunks, plus a last prompt token that the
    scheduler runs as a decode row when a chunk stopped one short of the end."""
    sched, n = llm.engine.scheduler, [0]
    plan = sched.schedule

    def counting():
        b = plan()
        n[0] += sum(b.prefill_lens) + sum(s.num_computed_tokens < s.num_prompt_tokens for s in b.decodes)
        return b

    sched.schedule = counting
    return n


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sched") / "m")
    hf = tiny_hf_model(path, "llama")
    prompts = _workload()
    return path, prompts, hf_greedy(hf, prompts, 6)


@pytest.mark.parametrize("chunk", [64, 16])
def test_shared_prefixes_computed_once(tiny, chunk):
    path, prompts, ref = tiny
    sp = SamplingParams(temperature=0, max_tokens=6, min_tokens=6)
    computed = {}
    for schedule in ("arrival", "throughput"):
        llm = LLM(path, schedule=schedule, block_size=BS, num_gpu_blocks=256, max_num_batched_tokens=chunk)
        rows = _count_prompt_rows(llm)
        outs = llm.generate(prompts, sp, use_tqdm=False)
        assert [o.token_ids for o in outs] == ref
        computed[schedule] = rows[0]
        assert llm.engine.kv.pool.num_used == 0
    assert computed["throughput"] == computed["arrival"] == _min_prefill_tokens(prompts)


def test_throughput_schedule_under_preemption(tiny):
    path, prompts, ref = tiny
    llm = LLM(path, schedule="throughput", block_size=BS, num_gpu_blocks=16, max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, min_tokens=6), use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    assert llm.engine.kv.pool.num_used == 0


def test_schedule_argument_checked():
    with pytest.raises(ValueError, match="schedule"):
        LLM(None, load_format="dummy", schedule="fastest")
