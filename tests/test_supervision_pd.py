"""`llmkern serve --pd 1P1D` (tiny model, loopback) under failure.

- A poison request (LLMKERN_FAULT_INJECT sample:POISON): the prefill replica fails it with a clean
  500 `request_error`, which is the client's answer; it is never sent on to the decode replica (no
  co-located fallback, no cascade), both replicas stay up and the next request is handed over as
  usual; SIGTERM then ends the launcher with exit code 0. Skipped when the engine has no fault
  injection.
- A SIGKILLed prefill, then decode, replica is restarted and rejoins the KV connector (the
  launcher hosts its store) within 60 s; every request sent meanwhile gets an answer (200 or a
  clean error), and the next one is handed over through the connector again.

The launchers and their replicas are reaped by the context manager, also on failure."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from serve_helpers import ServerProcess, post_completion, tiny_model_dir, wait_until  # noqa: E402

needs_faults = pytest.mark.skipif(importlib.util.find_spec("llmkern.engine.faults") is None,
                                  reason="the engine has no fault injection (LLMKERN_FAULT_INJECT)")
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory-gb", "0.02", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "512", "--block-size", "16"]


def _workers(srv) -> dict:
    return {w["role"]: w for w in httpx.get(srv.base + "/admin/workers", timeout=10).json()["workers"]}


@needs_faults
def test_pd_poison_request_is_an_error_not_a_cascade(tmp_path):
    model = tiny_model_dir(str(tmp_path / "tiny"))
    with ServerProcess(["--model", model, "--pd", "1P1D", *ENGINE_ARGS], env={"LLMKERN_FAULT_INJECT": "sample:POISON"},
                       new_session=True) as pd:
        wait_until(lambda: all(w["healthy"] for w in _workers(pd).values()), 120, "both replicas healthy")
        before = _workers(pd)
        for stream in (False, True):
            r = httpx.post(pd.base + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": "a POISON prompt", "max_tokens": 8, "stream": stream})
            assert r.status_code == 500, r.text
            assert r.json()["error"]["code"] == "request_error"
        after = _workers(pd)
        assert after["prefill"]["requests"] == before["prefill"]["requests"] + 2
        assert after["decode"]["requests"] == before["decode"]["requests"]      # never reached the decode side
        m = pd.metrics()
        assert m[("llmkern_router_pd_fallbacks_total", ())] == 0
        assert m[("llmkern_router_pd_decode_errors_total", ())] == 0
        # Both replicas up, never exited; the next request is prefilled and decoded as usual.
        assert all(w["healthy"] and w["exits"] == {} for w in after.values())
        ok = httpx.post(pd.base + "/v1/completions", timeout=60,
                        json={"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 8})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("length", "stop")
        assert pd.metrics()[("llmkern_router_pd_requests_total", ())] == 1
        # SIGTERM: nothing in flight, so the launcher drains at once and exits 0.
        pd.signal(signal.SIGTERM)
        assert pd.wait(60) == 0


# -- a SIGKILLed replica rejoins ------------------------------------------------------------------
CLEAN_CODES = {"replica_failed", "decode_unavailable", "no_healthy_worker", "engine_dead", "shutting_down"}


def _replica_counter(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _check_answer(res) -> str:
    """'ok' or the error code of one request's answer; fails on anything that is not a clean answer."""
    if res[0] == "done":
        assert res[1]["choices"][0]["finish_reason"] in ("length", "stop"), res
        return "ok"
    if res[0] == "http_error":
        code = res[2]["error"]["code"]
        assert code in CLEAN_CODES, res
        return code
    assert res[1] and res[1][-1] == "[DONE]", res      # a stream always ends, error or not
    last = json.loads(res[1][-2])
    if "error" in last:
        assert last["error"]["code"] in CLEAN_CODES, last
        return last["error"]["code"]
    assert last["choices"][0]["finish_reason"] in ("length", "stop"), last
    return "ok"


def _kill_under_load(pd, role: str) -> dict:
    """SIGKILL the replica of `role` while requests are in flight there (long ones streaming, short
    ones arriving every 0.2 s, also through the restart); every one gets an answer (bounded: none
    hangs). Returns the victim's /admin/workers entry."""
    victim = _workers(pd)[role]

    def kill_when_busy():
        try:
            wait_until(lambda: _workers(pd)[role]["inflight"] >= 1, 20, f"a request on the {role} replica")
        except AssertionError:
            pass                           # none caught in flight there: killed all the same
        os.kill(victim["pid"], signal.SIGKILL)

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(_one(client, pd.base, i, i % 2 == 0, 300)) for i in range(4)]
            killed = asyncio.get_running_loop().run_in_executor(None, kill_when_busy)
            while not killed.done() or len(tasks) < 20:
                tasks.append(asyncio.ensure_future(_one(client, pd.base, len(tasks), len(tasks) % 2 == 0, 8)))
                await asyncio.sleep(0.2)
            await killed
            return await asyncio.wait_for(asyncio.gather(*tasks), 150)

    answers = [_check_answer(r) for r in asyncio.run(scenario())]
    assert len(answers) >= 20
    if role == "prefill":   # served whole by the decode replica meanwhile; a lost hand-over is recomputed there
        assert set(answers) == {"ok"}, answers
    wait_until(lambda: all(w["healthy"] for w in _workers(pd).values()) and _workers(pd)[role]["pid"] not in
               (None, victim["pid"]), 60, f"the {role} replica back")
    return victim


async def _one(client, base, i, stream, max_tokens):
    return await post_completion(client, base, {"model": "tiny", "prompt": f"request {i}: tell me a long story",
                                                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                                "stream": stream})


def _handed_over(pd) -> None:
    """One request goes prefill -> decode and its KV is received by the decode replica (not recomputed)."""
    decode = _workers(pd)["decode"]["url"]
    before = pd.metrics()
    got = _replica_counter(decode, "llmkern:kv_transfers_total")
    failed = _replica_counter(decode, "llmkern:kv_transfers_failed_total")
    r = httpx.post(pd.base + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "after the restart, the full path again", "max_tokens": 6})
    assert r.status_code == 200, r.text
    after = pd.metrics()
    assert after[("llmkern_router_pd_requests_total", ())] == before[("llmkern_router_pd_requests_total", ())] + 1
    assert after[("llmkern_router_pd_fallbacks_total", ())] == before[("llmkern_router_pd_fallbacks_total", ())]
    assert _replica_counter(decode, "llmkern:kv_transfers_total") == got + 1
    assert _replica_counter(decode, "llmkern:kv_transfers_failed_total") == failed


@pytest.mark.parametrize("connector", ["shm", "torch"])
def test_pd_sigkilled_replicas_rejoin_and_hand_over_again(tmp_path, connector):
    """1P1D (shm, the default connector, and torch; the launcher hosts the rendezvous store): SIGKILL
    the prefill replica, then the decode replica, each under load; each is back within 60 s and the
    next request is handed over through the connector again."""
    model = tiny_model_dir(str(tmp_path / "tiny"))
    with ServerProcess(["--model", model, "--pd", "1P1D", "--kv-connector", connector, "--kv-transfer-timeout-s",
                        "20", *ENGINE_ARGS], new_session=True) as pd:
        wait_until(lambda: all(w["healthy"] for w in _workers(pd).values()), 120, "both replicas healthy")
        _handed_over(pd)
        for role in ("prefill", "decode"):
            victim = _kill_under_load(pd, role)
            w = _workers(pd)[role]
            assert w["restarts"] == 1 and w["exits"] == {"killed": 1}, w
            assert w["url"] == victim["url"]
            _handed_over(pd)
        assert all(w["restarts"] == 1 for w in _workers(pd).values())
        pd.signal(signal.SIGTERM)
        assert pd.wait(60) == 0
