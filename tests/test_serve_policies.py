"""Engine-side pieces the server relies on: the priority policy (queue order and preemption
victim), the dynamic batching policy, queue deadlines, and Engine.stats()."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams  # noqa: E402
from llmkern.engine import EngineConfig  # noqa: E402

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def engine(**kw):
    return LLM(dict(TINY), load_format="dummy", num_gpu_blocks=kw.pop("num_gpu_blocks", 64), block_size=4,
               **kw).engine


def run_all(eng):
    done = {}
    for _ in range(1000):
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
        if not eng.has_unfinished_requests():
            break
    for o in eng.step():
        done[o.request_id] = o
    assert eng.kv.pool.num_used == 0
    return done


def sp(n=6):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_queue_order(policy):
    eng = engine(max_num_seqs=1, policy=policy)
    prios = [3, 1, 2]
    ids = [eng.add_request([5, 6, 7], sp(), priority=p) for p in prios]
    done = run_all(eng)
    order = sorted(ids, key=lambda i: done[i].metrics.first_scheduled_time)
    expect = sorted(ids, key=lambda i: prios[ids.index(i)]) if policy == "priority" else ids
    assert order == expect


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_victim(policy):
    # 6 blocks of 4 tokens; two requests that each grow to 16 tokens (4 blocks) cannot both stay.
    eng = engine(num_gpu_blocks=6, max_num_seqs=2, policy=policy, enable_prefix_caching=False)
    low = eng.add_request([5, 6, 7, 8], sp(12), priority=5)
    high = eng.add_request([9, 10, 11, 12], sp(12), priority=0)
    done = run_all(eng)
    pre = {r: done[r].metrics.num_preemptions for r in (low, high)}
    # fcfs preempts the newest (high, added second); priority the lowest priority (low).
    victim = low if policy == "priority" else high
    assert pre[victim] >= 1 and pre[low if victim == high else high] == 0
    assert all(len(done[r].token_ids) == 12 for r in (low, high))


def test_dynamic_batch_waits_for_size_then_runs_to_completion():
    eng = engine(scheduler="dynamic", max_num_seqs=3, max_wait_ms=1e9)
    a = [eng.add_request([5, 6], sp(4)) for _ in range(2)]
    for _ in range(3):
        assert eng.step() == []
    assert eng.ready_in() > 0 and eng.stats().num_waiting == 2 and eng.stats().num_running == 0
    a.append(eng.add_request([7, 8], sp(4)))
    assert eng.ready_in() == 0
    eng.step()                                  # the batch of three starts together
    assert eng.stats().num_running == 3
    late = eng.add_request([9], sp(4))          # forms the next batch; does not join this one
    outs = {}
    for _ in range(20):
        for o in eng.step():
            outs[o.request_id] = o
        if all(r in outs for r in a):
            break
    assert all(len(outs[r].token_ids) == 4 for r in a)
    assert late not in outs and eng.stats().num_waiting == 1  # alone, it waits for a full batch
    assert eng.abort(late)
    eng.step()
    assert eng.kv.pool.num_used == 0


def test_dynamic_batch_starts_after_max_wait():
    eng = engine(scheduler="dynamic", max_num_seqs=8, max_wait_ms=50)
    r = eng.add_request([5, 6, 7], sp(3))
    w = eng.ready_in()
    assert 0 < w <= 0.05
    time.sleep(w + 0.01)
    assert eng.ready_in() == 0
    done = run_all(eng)
    assert len(done[r].token_ids) == 3


def test_queue_deadline_fails_unstarted_requests_only():
    eng = engine(max_num_seqs=1)
    a = eng.add_request([5, 6, 7], sp(8), queue_deadline=time.perf_counter() + 3600)
    eng.step()                                              # a starts
    b = eng.add_request([8, 9], sp(8), queue_deadline=time.perf_counter() - 1)
    c = eng.add_request([8, 9], sp(8))
    done = run_all(eng)
    assert done[b].finish_reason == "timeout" and done[b].token_ids == []
    assert done[b].metrics.first_scheduled_time is None
    assert len(done[a].token_ids) == 8 and len(done[c].token_ids) == 8


def test_stats_snapshot():
    eng = engine(max_num_seqs=4)
    total = eng.stats().kv_blocks_total
    assert eng.stats().kv_blocks_free == total and eng.stats().kv_usage == 0.0
    eng.add_request(list(range(3, 8)), sp(4))
    eng.add_request(list(range(20, 27)), sp(4), priority=1)   # no shared prefix: both start at once
    s = eng.stats()
    assert (s.num_waiting, s.num_running, s.prefill_tokens_pending) == (2, 0, 12)
    eng.step()
    s = eng.stats()
    assert (s.num_waiting, s.num_running, s.prefill_tokens_pending) == (0, 2, 0)
    assert s.kv_blocks_free == total - 2 - 2 and s.generation_tokens == 2   # 5+1 and 7+1 tokens in 4-token blocks
    run_all(eng)
    assert eng.stats().prefill_tok_s is None          # 12-token prefills: too small to measure a rate
    eng.add_request(list(range(3, 40)), sp(2))
    eng.step()
    assert eng.stats().prefill_tok_s > 0              # what the SLO admission predicts TTFT from


def test_pending_prefill_counts_only_what_a_waiting_request_will_compute():
    # A router weighs a replica's queue against a cache miss: a waiting request's cached prefix
    # is not work ahead of the next request.
    eng = engine(max_num_seqs=4)
    prompt = list(range(3, 24))                              # 21 tokens: 5 full blocks of 4
    eng.add_request(prompt, sp(2))
    run_all(eng)                                             # its blocks stay in the prefix cache
    eng.add_request(prompt[:16] + [50, 51, 52, 53, 54], sp(2))   # shares 4 blocks (16 tokens)
    eng.add_request(list(range(60, 69)), sp(2))              # 9 tokens, nothing cached
    s = eng.stats()
    assert s.num_waiting == 2 and s.prefill_tokens_pending == (21 - 16) + 9
    hits = eng.kv.stats.prefix_hit_tokens
    eng.step()                                               # both start: the estimate was what they found
    assert eng.kv.stats.prefix_hit_tokens - hits == 16
    run_all(eng)
    run_all(eng)
    with pytest.raises(ValueError, match="priority"):
        eng.add_request([5], sp(), priority="high")
    with pytest.raises(ValueError, match="policy"):
        EngineConfig(policy="lifo")
    with pytest.raises(ValueError, match="max_wait_ms"):
        EngineConfig(max_wait_ms=-1)
