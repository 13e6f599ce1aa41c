"""The router's copy of a replica's prefix cache: the router's block hashes for a prompt are the
ones the engine indexes (and predict exactly the engine's prefix hit), evictions reach the copy as
events, and a gap in the events or a log that moved on forces a snapshot. In-process engine on a
tiny random model; no HTTP."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("httpx")

from llmkern.router.kv_index import ReplicaKV, request_hashes  # noqa: E402
from llmkern.serve.kv_events import KVEventPublisher  # noqa: E402

BS = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from serve_helpers import tiny_model_dir

    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


def _llm(model_dir, num_blocks):
    from llmkern import LLM

    return LLM(model_dir, block_size=BS, num_gpu_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=256)


def _follow(pub: KVEventPublisher, kv: ReplicaKV) -> None:
    """Bring kv up to date with pub as a router would (events since its seq, else a snapshot)."""
    if not kv.synced:
        kv.apply_snapshot(pub.snapshot())
    events, cur = pub.since(kv.seq)
    assert events is not None
    assert kv.apply_message({"seq": cur, "events": events})


def _run(llm, prompt_ids, max_tokens=3):
    from llmkern import SamplingParams

    return llm.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(max_tokens=max_tokens, temperature=0),
                        use_tqdm=False)[0]


def test_router_hashes_are_the_engines_and_predict_its_prefix_hits(tiny_dir):
    llm = _llm(tiny_dir, 256)
    pub = KVEventPublisher(BS).attach(llm.engine)
    kv = ReplicaKV()
    rng = random.Random(0)
    system = [rng.randrange(250) for _ in range(41)]
    first = system + [rng.randrange(250) for _ in range(7)]
    _run(llm, first)
    _follow(pub, kv)
    assert kv.hashes == set(llm.engine.kv.pool.cached)           # the copy is the engine's own index
    # The router's hashes of the prompt are among the engine's stored ones.
    assert set(request_hashes(first, BS)) <= kv.hashes
    for tail_len in (0, 3, 9):
        follow = system + [rng.randrange(250) for _ in range(tail_len + 1)]
        predicted = kv.matched_blocks(request_hashes(follow, BS)) * BS
        out = _run(llm, follow)
        # What the router predicts is what the engine then serves from its cache.
        assert out.metrics.num_cached_prompt_tokens == predicted
        assert predicted >= (len(system) // BS) * BS - BS
        _follow(pub, kv)
    other = [rng.randrange(250) for _ in range(30)]
    assert kv.matched_blocks(request_hashes(other, BS)) == 0


def test_eviction_is_reflected(tiny_dir):
    llm = _llm(tiny_dir, 24)     # room for about two prompts: later ones evict earlier blocks
    pub = KVEventPublisher(BS).attach(llm.engine)
    kv = ReplicaKV()
    _follow(pub, kv)
    rng = random.Random(1)
    prompts = [[rng.randrange(250) for _ in range(37)] for _ in range(6)]
    for p in prompts:
        _run(llm, p)
        _follow(pub, kv)
        assert kv.hashes == set(llm.engine.kv.pool.cached)
    assert kv.matched_blocks(request_hashes(prompts[0], BS)) == 0     # evicted long ago
    assert kv.matched_blocks(request_hashes(prompts[-1], BS)) == len(request_hashes(prompts[-1], BS))
    assert any(kind == "removed" for _, kind, _ in pub.since(0)[0])


def test_gap_in_events_forces_a_snapshot():
    pub = KVEventPublisher(BS)
    for h in range(1, 6):
        pub.record("stored", h)
    kv = ReplicaKV()
    kv.apply_snapshot(pub.snapshot())
    assert kv.seq == 5 and kv.hashes == {1, 2, 3, 4, 5}
    pub.record("removed", 2)            # seq 6: missed by the router
    pub.record("stored", 7)             # seq 7
    events, cur = pub.since(6)
    assert not kv.apply_message({"seq": cur, "events": events})   # 7 does not follow 5
    assert not kv.synced and kv.resyncs == 1
    kv.apply_snapshot(pub.snapshot())
    assert kv.hashes == {1, 3, 4, 5, 7} and kv.seq == 7
    # Events already contained in the snapshot are skipped, not applied twice.
    assert kv.apply_message({"seq": 7, "events": pub.since(5)[0]}) and kv.hashes == {1, 3, 4, 5, 7}


def test_event_log_that_moved_on_answers_reset():
    pub = KVEventPublisher(BS, max_events=4)
    for h in range(10):
        pub.record("stored", h)
    assert pub.since(2) == (None, 10)           # events 3..6 are gone: take a snapshot
    events, cur = pub.since(7)
    assert cur == 10 and [e[0] for e in events] == [8, 9, 10]
    assert pub.since(11) == (None, 10)          # a reader of another incarnation
    kv = ReplicaKV()
    kv.apply_snapshot(pub.snapshot())
    assert not kv.apply_message({"reset": True, "seq": 10}) and not kv.synced


def test_routed_blocks_count_until_the_replica_reports_them_or_they_age_out():
    from llmkern.router.kv_index import PENDING_TTL_S

    pub = KVEventPublisher(BS)
    pub.record("stored", 11)
    kv = ReplicaKV()
    kv.apply_snapshot(pub.snapshot())
    req = [11, 12, 13]                   # block 11 cached, 12 and 13 being prefilled after routing
    assert kv.matched_blocks(req, now=0.0) == 1
    kv.note_routed(req, now=0.0)
    assert kv.matched_blocks(req, now=1.0) == 3
    assert kv.matched_blocks(req, now=PENDING_TTL_S + 1.0) == 1   # never confirmed: aged out
    kv.note_routed(req, now=100.0)
    pub.record("stored", 12)
    pub.record("removed", 13)            # evicted before the router's copy was told it was stored
    events, cur = pub.since(kv.seq)
    assert kv.apply_message({"seq": cur, "events": events})
    assert 12 in kv.hashes and 12 not in kv.pending and 13 not in kv.pending
    assert kv.matched_blocks(req, now=101.0) == 2
