"""Routing decisions on hand-made worker states: cache_aware's continuous score, least_load,
round_robin, and approx_tree (radix tree matching and eviction; SGLang's cache/balance rules)."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

pytest.importorskip("httpx")

from llmkern.engine.block_pool import block_hash  # noqa: E402
from llmkern.router.approx_tree import ApproxTree  # noqa: E402
from llmkern.router.kv_index import ReplicaKV  # noqa: E402
from llmkern.router.policies import (ApproxTreePolicy, CacheAware, LeastLoad, RoundRobin,  # noqa: E402
                                     RouteRequest, make_policy)

BS = 4


class FakeWorker:
    def __init__(self, url, cached_tokens=(), inflight=0, kv_usage=0.0):
        self.url = url
        self.inflight = inflight
        self.kv = ReplicaKV()
        hashes, parent = [], 0
        toks = list(cached_tokens)
        for i in range(len(toks) // BS):        # hashes written out here, block by block
            parent = block_hash(parent, toks[i * BS:(i + 1) * BS])
            hashes.append(parent)
        self.kv.apply_snapshot({"seq": 0, "block_size": BS, "hashes": hashes,
                                "load": {"num_waiting": 0, "num_running": 0, "kv_usage": kv_usage}})


PROMPT = list(range(100, 141))       # 41 tokens: 10 full blocks before the last token


def test_cached_fraction_counts_leading_blocks_only():
    req = RouteRequest(PROMPT, "")
    assert req.cached_fraction(FakeWorker("a", PROMPT[:20])) == pytest.approx(20 / 41)
    # Same blocks 2.. but a different first block: chained hashes do not match at all.
    assert req.cached_fraction(FakeWorker("b", [0, 0, 0, 0] + PROMPT[4:20])) == 0.0
    assert req.cached_fraction(FakeWorker("c", PROMPT)) == pytest.approx(40 / 41)


def test_cache_aware_prefers_cache_then_balances_continuously():
    pol = CacheAware()
    long_prompt = list(range(1000, 1401))     # 401 tokens: the cache is worth 4 x 400 tokens of queue
    req = RouteRequest(long_prompt, "")
    cold, warm = FakeWorker("cold"), FakeWorker("warm", long_prompt)
    assert pol.rank(req, [cold, warm])[0] is warm
    warm.inflight = 4                          # busier (4 x 64 tokens), but the cache is worth more
    assert pol.rank(req, [cold, warm])[0] is warm
    warm.inflight = 32                         # 32 x 64 = 2048 > 1600: the idle worker wins
    assert pol.rank(req, [cold, warm])[0] is cold
    warm.inflight = 0
    warm.kv.load["prefill_tokens_pending"] = 1700  # a long queue of prompts to compute: same
    assert pol.rank(req, [cold, warm])[0] is cold
    warm.kv.load["prefill_tokens_pending"] = 0
    # The score falls steadily with load (no cliff) and with KV usage.
    s = [pol.scores(req, [cold, FakeWorker("w", long_prompt, inflight=k)])[1] for k in range(6)]
    assert all(a > b for a, b in zip(s, s[1:]))
    full = FakeWorker("full", long_prompt, kv_usage=0.95)
    assert pol.scores(req, [cold, full])[1] < pol.scores(req, [cold, FakeWorker("warm2", long_prompt)])[1]
    # A partial hit against an equal-load cold worker: the partial hit wins.
    part = FakeWorker("part", long_prompt[:12])
    assert pol.rank(req, [cold, part])[0] is part
    # Tokens this router just sent count as queued until a load report that left the replica
    # after them arrives (one arriving at once may have crossed them on the way).
    busy = FakeWorker("busy", long_prompt)
    now = [100.0]
    busy.kv.clock = lambda: now[0]
    busy.kv.note_routed([], new_tokens=1700)
    assert pol.rank(req, [cold, busy])[0] is cold
    report = {"seq": 0, "events": [], "load": {"num_waiting": 0, "num_running": 0}}
    busy.kv.apply_message(report)
    assert pol.rank(req, [cold, busy])[0] is cold
    now[0] += 0.3
    busy.kv.apply_message(report)
    assert pol.rank(req, [cold, busy])[0] is busy


def test_reported_load_counts_for_other_routers_traffic():
    pol = CacheAware()
    req = RouteRequest(PROMPT, "")
    a, b = FakeWorker("a", PROMPT[:8]), FakeWorker("b", PROMPT[:8])
    b.kv.load["num_waiting"] = 10              # queued by someone else
    assert pol.rank(req, [b, a])[0] is a
    assert LeastLoad().rank(req, [b, a])[0] is a


def test_round_robin_cycles():
    ws = [FakeWorker(u) for u in "abc"]
    rr = RoundRobin()
    assert [rr.rank(RouteRequest([], ""), ws)[0].url for _ in range(6)] == list("abcabc")


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="policy"):
        make_policy("random")


def test_approx_tree_matching_splitting_and_eviction():
    t = ApproxTree(max_chars=30)
    t.insert("hello world")
    t.insert("hello there")          # splits the edge after "hello "
    assert t.match("hello world!") == 11
    assert t.match("hello th") == 8
    assert t.match("help") == 3
    assert t.match("xyz") == 0
    assert t.size == len("hello ") + len("world") + len("there")
    t.match("hello there")           # touch: "world" is now the least recently used leaf
    t.insert("a completely different text")   # over 30 chars: prune LRU leaves
    assert t.size <= 30
    assert t.match("hello world") < 11
    assert t.match("a completely different text") == len("a completely different text")


def test_approx_tree_policy_follows_text_then_balances():
    pol = ApproxTreePolicy(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    a, b = FakeWorker("a"), FakeWorker("b")
    sys_a, sys_b = "tenant A system prompt. " * 4, "tenant B instructions here! " * 4
    first = pol.rank(RouteRequest([], sys_a + "q1"), [a, b])[0]
    # Low match for B: the worker with the smaller tree, i.e. the other one.
    second = pol.rank(RouteRequest([], sys_b + "q1"), [a, b])[0]
    assert second is not first
    for i in range(3):
        assert pol.rank(RouteRequest([], sys_a + f"q{i + 2}"), [a, b])[0] is first
        assert pol.rank(RouteRequest([], sys_b + f"q{i + 2}"), [a, b])[0] is second
    # Imbalanced beyond both thresholds: the least loaded worker, whatever the match.
    first.inflight = 10
    assert pol.rank(RouteRequest([], sys_a + "q9"), [a, b])[0] is second
    first.inflight, second.inflight = 5, 4   # a gap of 1 <= 4: balanced again, back to the cache
    assert pol.rank(RouteRequest([], sys_a + "q10"), [a, b])[0] is first


def test_cli_rejects_bad_arguments():
    pytest.importorskip("fastapi")
    from llmkern.cli import main

    with pytest.raises(SystemExit, match="worker: expected an http"):
        main(["router", "--worker", "notaurl"])
    with pytest.raises(SystemExit, match="--data-parallel-size: expected an integer >= 1"):
        main(["serve", "--data-parallel-size", "0"])


def test_cache_aware_spreads_new_prefixes():
    """A prompt cached nowhere, equal loads: the worker holding less cache takes it."""
    pol = CacheAware()
    full, empty = FakeWorker("full", list(range(500, 540))), FakeWorker("empty")
    assert pol.rank(RouteRequest(PROMPT, ""), [full, empty])[0] is empty
    assert pol.rank(RouteRequest(PROMPT, ""), [empty, full])[0] is empty
