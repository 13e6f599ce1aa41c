"""Two tiny-model replicas on loopback behind `llmkern router` (and `llmkern serve
--data-parallel-size 2`), through the real `openai` client and httpx: outputs equal a single
engine's, requests follow cached prefixes (checked against the replicas' own prefix-hit counters),
a restarted router resynchronises, and a replica killed mid-run loses no request: each one either
completes or ends with an error (event), and the survivor serves the rest. Every process is reaped by
its context manager, also on failure."""
from __future__ import annotations

import asyncio
import json
import signal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from serve_helpers import ServerProcess, post_completion, tiny_model_dir, wait_until  # noqa: E402

ENGINE_ARGS = ["--kv-cache-memory-gb", "0.02", "--max-num-seqs", "16", "--max-num-batched-tokens", "512"]
TENANTS = ["You are the billing assistant of ACME. Answer politely, briefly, and cite the invoice. " * 2,
           "Tu es un traducteur: rends chaque phrase en anglais simple, sans commentaire ajoute. " * 2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def llm(model_dir):
    from llmkern import LLM

    return LLM(model_dir, kv_cache_memory_gb=0.02, max_num_seqs=16, max_num_batched_tokens=512)


def _router(model_dir, replicas, wait=True):
    args = ["--model", model_dir]
    for r in replicas:
        args += ["--worker", r.base]
    return ServerProcess(args, command="router", wait=wait)


@pytest.fixture(scope="module")
def cluster(model_dir):
    """Two replicas and a router, all started at once (process start-up dominates this module)."""
    procs = []
    try:
        reps = [ServerProcess(["--model", model_dir, "--served-model-name", "tiny", *ENGINE_ARGS], wait=False)
                for _ in range(2)]
        procs += reps
        router = _router(model_dir, reps, wait=False)
        procs.append(router)
        for p in procs:
            p.wait_ready()
        _wait_synced(router, 2)
        yield router, reps
    finally:
        for p in procs:
            p.__exit__(None, None, None)


def _workers(router):
    return {w["url"]: w for w in httpx.get(router.base + "/admin/workers", timeout=10).json()["workers"]}


def _wait(cond, timeout=20.0, what="condition"):
    return wait_until(cond, timeout, what)


def _wait_synced(router, n):
    _wait(lambda: sum(w["healthy"] and w["synced"] for w in _workers(router).values()) == n, what="workers synced")


def _snapshot_size(rep):
    return len(httpx.get(rep.base + "/kv/snapshot", timeout=10).json()["hashes"])


def _wait_router_caught_up(router, reps):
    """Until the router's copy of every replica's cache has the replica's own size."""
    def ok():
        ws = _workers(router)
        return all(ws[r.base]["synced"] and ws[r.base]["cached_blocks"] == _snapshot_size(r) for r in reps)
    _wait(ok, what="the router's KV copy to catch up")


def _ref(llm, prompt, **kw):
    from llmkern import SamplingParams

    return llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0]


def test_outputs_equal_a_single_engine(cluster, llm):
    router, _ = cluster
    c = router.client()
    for p in [TENANTS[0] + "Where is my refund?", "The quick brown fox", TENANTS[1] + "Bonjour"]:
        ref = _ref(llm, p, max_tokens=20, temperature=0)
        r = c.completions.create(model="tiny", prompt=p, max_tokens=20, temperature=0)
        assert r.choices[0].text == ref.text and r.usage.completion_tokens == len(ref.token_ids)
        parts = [ch.choices[0].text for ch in c.completions.create(model="tiny", prompt=p, max_tokens=20,
                                                                     temperature=0, stream=True) if ch.choices]
        assert "".join(parts) == ref.text
    msgs = [{"role": "user", "content": "hello"}]
    ref = _ref(llm, msgs, max_tokens=12, temperature=0)
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == ref.text
    # Errors of the replica come through unchanged (OpenAI error objects).
    bad = httpx.post(router.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "top_p": 7}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
    assert httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"


def test_routing_follows_cached_prefixes(cluster):
    router, reps = cluster
    c = router.client()
    home = {}
    for turn in range(4):
        for t, system in enumerate(TENANTS):
            _wait_router_caught_up(router, reps)
            before = {u: w["requests"] for u, w in _workers(router).items()}
            hits_before = [_prefix_hits(r) for r in reps]
            c.completions.create(model="tiny", prompt=system + f"question {turn}?", max_tokens=2, temperature=0)
            after = _workers(router)
            (chosen,) = [u for u, w in after.items() if w["requests"] > before[u]]
            if turn == 0:
                home[t] = chosen
                continue
            assert chosen == home[t], f"tenant {t}, turn {turn}: routed away from its cached prefix"
            # The replica itself confirms the hit: most of the system prompt came from its cache.
            gained = [_prefix_hits(r) - h for r, h in zip(reps, hits_before)]
            served = gained[[r.base for r in reps].index(chosen)]
            assert served >= len(system) - 32


def _prefix_hits(rep) -> float:
    return sum(v for (name, _), v in rep.metrics().items() if name.endswith("prefix_cache_hits_total"))


def test_restarted_router_resynchronises(cluster, model_dir):
    _, reps = cluster
    sizes = [_snapshot_size(r) for r in reps]
    assert sum(sizes) > 0
    with _router(model_dir, reps) as fresh:
        _wait_synced(fresh, 2)
        _wait_router_caught_up(fresh, reps)
        ws = _workers(fresh)
        assert [ws[r.base]["cached_blocks"] for r in reps] == [_snapshot_size(r) for r in reps]


def test_admin_add_and_remove_worker(cluster):
    router, reps = cluster
    base = router.base + "/admin/workers"
    assert httpx.post(base, json={"url": "not a url"}, timeout=10).status_code == 400
    assert httpx.post(base, json={"url": reps[0].base}, timeout=10).status_code == 400   # already there
    assert httpx.delete(base, params={"url": reps[1].base}, timeout=10).status_code == 204
    assert list(_workers(router)) == [reps[0].base]
    assert httpx.delete(base, params={"url": reps[1].base}, timeout=10).status_code == 404
    r = httpx.post(base, json={"url": reps[1].base}, timeout=10)
    assert r.status_code == 201
    _wait_synced(router, 2)


async def _one(client, base, i, stream):
    return await post_completion(client, base, {"model": "tiny", "prompt": TENANTS[i % 2] + f"long answer {i}",
                                                "max_tokens": 160, "temperature": 0, "ignore_eos": True,
                                                "stream": stream})


def test_replica_killed_mid_run(cluster):
    """Last test on the cluster: it kills one of its replicas."""
    router, reps = cluster

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(_one(client, router.base, i, stream=i % 2 == 0)) for i in range(8)]
            # Kill the busier replica once most requests are in flight.
            def busy():
                ws = _workers(router)
                return sum(w["inflight"] for w in ws.values()) >= 6 and ws
            ws = await asyncio.get_running_loop().run_in_executor(None, lambda: _wait(busy, 30, "work"))
            victim = max(reps, key=lambda r: ws[r.base]["inflight"])
            victim.signal(signal.SIGKILL)
            return victim, await asyncio.wait_for(asyncio.gather(*tasks), 120)

    victim, results = asyncio.run(scenario())
    survivor = reps[1 - reps.index(victim)]
    failed = 0
    for res in results:                      # none lost: each finished or says why not
        if res[0] == "done":
            assert res[1]["choices"][0]["finish_reason"] == "length"
            assert res[1]["usage"]["completion_tokens"] == 160
        elif res[0] == "http_error":         # in flight on the victim: this router cannot know the request
            assert res[1] == 502 and res[2]["error"]["code"] == "replica_failed"   # did not kill it: no retry
            failed += 1
        elif res[0] == "stream":
            ev = res[1]
            assert ev[-1] == "[DONE]"
            objs = [json.loads(e) for e in ev[:-1]]
            if "error" in objs[-1]:
                assert objs[-1]["error"]["code"] == "replica_failed"
                failed += 1
            else:
                assert objs[-1]["choices"][0]["finish_reason"] == "length"
        else:
            raise AssertionError(f"request lost: {res}")
    # The survivor serves the rest.
    c = router.client()
    for i in range(3):
        r = c.completions.create(model="tiny", prompt=TENANTS[i % 2] + "after", max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
    m = router.metrics()
    assert m[("llmkern_router_worker_healthy", (("worker", victim.base),))] == 0
    assert m[("llmkern_router_worker_healthy", (("worker", survivor.base),))] == 1
    assert m[("llmkern_router_failures_total", (("worker", victim.base),))] == failed
    lost_attempts = m[("llmkern_router_retries_total", (("worker", victim.base),))]
    assert failed + lost_attempts >= 1       # the victim had work in flight


def test_data_parallel_launcher(model_dir, llm):
    with ServerProcess(["--model", model_dir, "--served-model-name", "tiny", "--data-parallel-size", "2",
                        *ENGINE_ARGS]) as dp:
        _wait_synced(dp, 2)
        urls = list(_workers(dp))
        r = dp.client().completions.create(model="tiny", prompt="The quick brown fox", max_tokens=10, temperature=0)
        assert r.choices[0].text == _ref(llm, "The quick brown fox", max_tokens=10, temperature=0).text
    # The launcher is gone (killed): its replicas went with it.
    def down():
        for u in urls:
            try:
                httpx.get(u + "/health", timeout=1)
                return False
            except httpx.HTTPError:
                pass
        return True
    _wait(down, 20, "the replicas to exit")
