"""`llmkern serve` under LLMKERN_FAULT_INJECT: a request that fails in the engine is a 500
request_error (streamed: an error event, then [DONE]) while the requests beside it complete and
the server stays healthy; an engine that dies answers what it had in flight with a JSON error and
the process exits non-zero, so that a supervisor restarts it."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from serve_helpers import ServerProcess, tiny_model_dir  # noqa: E402

ENGINE_ARGS = ["--kv-cache-memory-gb", "0.02", "--max-num-seqs", "16", "--served-model-name", "tiny"]
NORMAL = ["Hello there", "The quick brown fox", "abc", "Once upon a time"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def server(model_dir):
    # Steps slowed down, so that the poisoned requests share batches with the normal ones.
    with ServerProcess(["--model", model_dir, *ENGINE_ARGS],
                       env={"LLMKERN_FAULT_INJECT": "sample:POISON,delay_ms:20"}) as s:
        yield s


def body(prompt, **kw):
    return dict({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}, **kw)


async def stream_events(client, url, b):
    """(status, [decoded data events]) of a streamed request."""
    async with client.stream("POST", url, json=dict(b, stream=True)) as r:
        if r.status_code != 200:
            return r.status_code, [json.loads(await r.aread())]
        events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    return 200, [e if e == "[DONE]" else json.loads(e) for e in events]


def assert_request_error(err: dict):
    e = err["error"]
    assert e["code"] == "request_error" and e["type"] == "InternalServerError" and e["param"] is None
    assert "sample phase" in e["message"] and "InjectedFault" in e["message"]


def test_poison_request_fails_alone(server):
    url = server.base + "/v1/completions"
    ref = [httpx.post(url, json=body(p), timeout=60).json()["choices"][0]["text"] for p in NORMAL]

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as c:
            normal = [c.post(url, json=body(p)) for p in NORMAL]
            return await asyncio.wait_for(asyncio.gather(c.post(url, json=body("POISON pill")), *normal,
                                                         stream_events(c, url, body("a POISON stream")),
                                                         stream_events(c, url, body(NORMAL[0]))), 120)

    poison, *normal, poison_stream, normal_stream = asyncio.run(scenario())
    assert poison.status_code == 500, poison.text
    assert_request_error(poison.json())
    assert [r.status_code for r in normal] == [200] * len(NORMAL)
    assert [r.json()["choices"][0]["text"] for r in normal] == ref
    status, events = poison_stream   # the stream's answer: an error event, then [DONE]
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 2, events
    assert_request_error(events[0])
    status, events = normal_stream
    assert status == 200 and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == ref[0]
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    assert httpx.post(url, json=body(NORMAL[1]), timeout=60).json()["choices"][0]["text"] == ref[1]
    m = server.metrics()
    assert m[("llmkern:kv_cache_usage_perc", ())] == 0


def test_dead_engine_ends_the_process(model_dir):
    with ServerProcess(["--model", model_dir, *ENGINE_ARGS],
                       env={"LLMKERN_FAULT_INJECT": "fatal:DIE,delay_ms:20"}) as s:
        url = s.base + "/v1/completions"

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as c:
                long_ = asyncio.ensure_future(c.post(url, json=body("a long one", max_tokens=400)))
                streamed = asyncio.ensure_future(stream_events(c, url, body("streamed", max_tokens=400)))
                await asyncio.sleep(1.0)   # both running (about 50 steps a second)
                die = await c.post(url, json=body("DIE"))
                return die, await long_, await streamed

        die, long_, (status, events) = asyncio.run(asyncio.wait_for(scenario(), 120))
        for r in (die, long_):   # answered with a JSON error, not left hanging
            assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error", r.text
        assert status == 200 and events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_error"
        deadline = time.monotonic() + 60
        while s.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert s.proc.poll() not in (None, 0), s.output()
        assert "the engine died (InjectedFault)" in s.output()


def test_intake_fault_fails_its_request_only(model_dir):
    """An error the request checks did not foresee, raised while the engine takes the request in."""
    from fastapi.testclient import TestClient

    from llmkern.engine import Engine, EngineConfig
    from llmkern.serve import ServeConfig, build_app
    from llmkern.serve.engine_loop import EngineLoop

    eng = Engine(model_dir, EngineConfig(kv_cache_memory_gb=0.01))
    add = eng.add_request

    def add_request(prompt, params=None, **kw):
        if kw.get("priority") == 7:
            raise KeyError("an unforeseen input")
        return add(prompt, params, **kw)

    eng.add_request = add_request
    loop = EngineLoop(eng).start()
    try:
        with TestClient(build_app(loop, ServeConfig(), "tiny")) as c:
            r = c.post("/v1/completions", json=body("abc", priority=7))
            assert r.status_code == 500 and r.json()["error"]["code"] == "request_error", r.text
            assert "KeyError" in r.json()["error"]["message"] and "unforeseen" not in r.text
            assert c.post("/v1/completions", json=body("abc")).status_code == 200
            assert c.get("/health").status_code == 200
        assert loop.alive and not eng.requests and eng.kv.pool.num_used == 0
    finally:
        loop.stop()
