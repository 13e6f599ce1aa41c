"""A prefill or decode engine that restarts under its old rank rejoins its peers (pd/pull.py's
incarnations), for both connectors (shm; p2p, whose pair groups are formed again with the new
incarnation), both engines in this process, connected to a store that outlives them (as `serve
--pd`'s launcher hosts it). The dead incarnation is simulated by an engine that is never stepped
again (and shut down, as its death closes its sockets): same pid, so only the incarnation
number tells it from the new one.

What is checked: transfers in flight with the dead incarnation fail at once (the deadlines are
300 s, and every loop is bounded by WAIT_S), the prefill side releases the blocks of a dead
decode incarnation's pulls at once, the new incarnation's hand-overs give the co-located
engine's greedy tokens, and no block leaks."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from test_pd_engine import (GREEDY, PROMPTS, assert_baseline, drain, engine, kv_blocks, new_store,  # noqa: E402
                            prefill, reference, run_decode)
from llmkern.pd.pull import LIVENESS_S  # noqa: E402

__all__ = ["reference"]   # the fixture, used here
LONG = dict(kv_transfer_timeout_s=300)


@pytest.fixture(params=["shm", "p2p"])
def mk(request, tmp_path):
    store = new_store()
    made = []
    where = dict(shm_dir=str(tmp_path)) if request.param == "shm" else {}

    def make(role, rank, **kw):
        made.append(engine(role, dict(kind=request.param, rank=rank, world_size=2, store=store, timeout_s=300,
                                      **where), **dict(LONG, **kw)))
        return made[-1]
    yield make
    for e in made:
        e.shutdown()


def test_prefill_restart_fails_old_transfers_at_once_then_hands_over(mk, reference, tmp_path):
    P1, D = mk("prefill", 0), mk("decode", 1)
    (a,) = prefill(P1, PROMPTS[:1])
    (b,) = prefill(P1, PROMPTS[1:2], prefix="b")
    D.add_request(PROMPTS[0], GREEDY, request_id="a", kv_transfer_params=a.kv_transfer_params)
    D.step()                           # the pull is posted to incarnation 1
    P1.shutdown()                      # it dies (its sockets close) and is never stepped again
    P2 = mk("prefill", 0)              # rank 0 again
    assert P2.handover.connector.inc == P1.handover.connector.inc + 1
    d = drain(D)["a"]                  # in flight: fails at once, not at the 300 s deadline
    assert d.finish_reason == "error" and "rank 0" in d.error and "deadline" not in d.error, d.error
    D.add_request(PROMPTS[1], GREEDY, request_id="b", kv_transfer_params=b.kv_transfer_params)
    d = drain(D)["b"]                  # not posted yet: refused at once too
    assert d.finish_reason == "error" and "rank 0" in d.error and "deadline" not in d.error, d.error
    (c,) = prefill(P2, PROMPTS[2:3], prefix="c")
    D.add_request(PROMPTS[2], GREEDY, request_id="c", kv_transfer_params=c.kv_transfer_params)
    got = run_decode(P2, D)["c"]
    assert got.error is None and got.outputs[0].token_ids == reference(PROMPTS[2])
    assert got.metrics.kv_transfer_bytes > 0 and D.stats().prompt_tokens_computed == 0
    assert_baseline(P2, D)


def test_decode_restart_releases_its_pulls_then_hands_over(mk, reference, tmp_path):
    P, D1 = mk("prefill", 0), mk("decode", 1, kv_transfer_fallback="recompute")
    outs = prefill(P, PROMPTS[:2])
    for o, p in zip(outs, PROMPTS):
        D1.add_request(p, GREEDY, request_id=o.request_id, kv_transfer_params=o.kv_transfer_params)
    D1.step()                          # both pulls posted by incarnation 1, which then dies
    D1.shutdown()
    assert P.stats().kv_blocks_pinned == sum(kv_blocks(len(p)) for p in PROMPTS[:2])
    D2 = mk("decode", 1)
    time.sleep(2 * LIVENESS_S)         # past the prefill side's cached view of its peers
    # The prefill side sees the new incarnation, drops the old one's pulls and releases their blocks
    # at once: long before the 300 s deadline, nothing written for a reader that is gone.
    drain(P, until=lambda: P.stats().kv_blocks_pinned == 0 and not P.handover.connector.has_pending())
    assert P.stats().kv_blocks_pinned == 0
    assert (P.stats().kv_transfers_failed, P.stats().kv_transfers_done) == (2, 0)
    assert list(tmp_path.iterdir()) == []
    (c,) = prefill(P, PROMPTS[2:3], prefix="c")
    D2.add_request(PROMPTS[2], GREEDY, request_id="c", kv_transfer_params=c.kv_transfer_params)
    got = run_decode(P, D2)["c"]
    assert got.error is None and got.outputs[0].token_ids == reference(PROMPTS[2])
    assert D2.stats().kv_transfers_done == 1 and D2.stats().prompt_tokens_computed == 0
    assert_baseline(P, D2)
