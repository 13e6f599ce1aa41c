"""In-process checks of the server's foundations: the kernels release the GIL (an asyncio
heartbeat keeps ticking while a long kernel runs on another thread), and /health turns 503 when
the engine loop dies (an app built with build_app over an engine whose step fails), and the
start-up objects are frozen out of the garbage collector's full collections."""
from __future__ import annotations

import asyncio
import gc
import threading
import weakref
import time

import pytest
import torch

import llmkern


def _attention_call(s: int):
    torch.manual_seed(0)
    q, k, v = (torch.randn(s, 4, 64) for _ in range(3))
    cu = torch.tensor([0, s], dtype=torch.int32)
    return lambda: llmkern.flash_attn_varlen_func(q, k, v, cu, cu, s, s, causal=True)


def test_kernels_release_the_gil():
    threads = llmkern.get_num_threads() if hasattr(llmkern, "get_num_threads") else None
    if threads is not None:
        llmkern.set_num_threads(1)   # leave a core to the heartbeat
    try:
        s, call, dt = 512, None, 0.0
        while s <= 16384:
            call = _attention_call(s)
            call()
            t0 = time.perf_counter()
            call()
            dt = time.perf_counter() - t0
            if dt >= 0.3:
                break
            s *= 2
        assert dt >= 0.1, "could not make a long enough kernel call"

        async def heartbeat():
            done = threading.Event()
            th = threading.Thread(target=lambda: (call(), done.set()))
            gaps, last = [], time.perf_counter()
            th.start()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
            th.join()
            return gaps

        gaps = asyncio.run(heartbeat())
        # Holding the GIL, the kernel would stall the loop for its whole duration (one gap ~ dt).
        assert len(gaps) >= 10 and max(gaps) < dt / 2, (len(gaps), max(gaps), dt)
    finally:
        if threads is not None:
            llmkern.set_num_threads(threads)


def test_health_503_after_engine_loop_dies(tmp_path):
    pytest.importorskip("fastapi")
    import httpx
    import uvicorn

    from llmkern.engine import Engine, EngineConfig
    from llmkern.serve import ServeConfig, build_app
    from llmkern.serve.engine_loop import EngineLoop
    from serve_helpers import free_port, tiny_model_dir

    eng = Engine(tiny_model_dir(str(tmp_path)), EngineConfig(kv_cache_memory_gb=0.01))

    def broken_step():
        raise RuntimeError("injected engine fault")

    eng.step = broken_step
    loop = EngineLoop(eng).start()
    port = free_port()
    app = build_app(loop, ServeConfig(port=port), "tiny")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        assert httpx.get(base + "/health", timeout=5).status_code == 200
        r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 3}, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
        assert "injected" not in r.text and "Traceback" not in r.text
        h = httpx.get(base + "/health", timeout=5)
        assert h.status_code == 503 and h.json()["error"]["code"] == "engine_dead"
        r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "abc"}, timeout=10)
        assert r.status_code == 503
    finally:
        server.should_exit = True
        th.join(15)
        loop.stop()


class _FakeLoop:
    def __init__(self, stats, pending=(0, 0)):
        self.stats, self.pending = stats, pending

    def load(self):
        return self.stats, self.pending[0], self.pending[1]


def _stats(**kw):
    from llmkern.engine.metrics import EngineStats

    base = dict(num_running=0, num_waiting=0, num_swapped=0, prefill_tokens_pending=0, kv_blocks_total=10,
                kv_blocks_free=10, num_preemptions=0, prefix_query_tokens=0, prefix_hit_tokens=0,
                prompt_tokens_computed=0, generation_tokens=0, prefill_tok_s=None)
    base.update(kw)
    return EngineStats(**base)


def test_admission_slo_and_token_limits():
    from llmkern.serve.admission import Admission
    from llmkern.serve.config import ServeConfig
    from llmkern.serve.errors import APIError

    slo = ServeConfig(slo_ttft_ms=2000)
    # No prefill rate measured yet: nothing to predict from, so admitted.
    Admission(slo, _FakeLoop(_stats(prefill_tokens_pending=10 ** 6))).check(1, 100)
    # 1000 tokens queued + 100 new at 500 tok/s: 2.2 s predicted > 2 s.
    busy = _FakeLoop(_stats(prefill_tokens_pending=800, prefill_tok_s=500.0), pending=(1, 200))
    adm = Admission(slo, busy)
    assert abs(adm.predicted_ttft_s(100) - 2.2) < 1e-9
    with pytest.raises(APIError) as ei:
        adm.check(1, 100)
    assert ei.value.status == 429 and ei.value.code == "slo" and ei.value.headers["Retry-After"] == "2"
    Admission(ServeConfig(slo_ttft_ms=3000), busy).check(1, 100)          # 2.2 s meets 3 s
    # Queued-token and queued-request bounds count what the engine holds plus what is in transit.
    tok = Admission(ServeConfig(max_queued_tokens=1100), busy)
    tok.check(1, 100)
    with pytest.raises(APIError) as ei:
        tok.check(1, 101)
    assert ei.value.code == "queue_tokens_full"
    req = Admission(ServeConfig(max_queued_requests=3), _FakeLoop(_stats(num_waiting=2), pending=(1, 5)))
    with pytest.raises(APIError) as ei:
        req.check(1, 1)
    assert ei.value.code == "queue_full"
    Admission(ServeConfig(max_queued_requests=4), _FakeLoop(_stats(num_waiting=2), pending=(1, 5))).check(1, 1)


def test_cors_off_unless_asked():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from llmkern.serve import ServeConfig, build_app

    class Eng:
        max_model_len, tokenizer = 64, None

    loop = _FakeLoop(_stats())
    loop.engine, loop.alive = Eng(), True
    pre = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    off = TestClient(build_app(loop, ServeConfig(), "m"))
    assert "access-control-allow-origin" not in off.options("/v1/completions", headers=pre).headers
    assert "access-control-allow-origin" not in off.get("/v1/models", headers={"Origin": "http://example.com"}).headers
    on = TestClient(build_app(loop, ServeConfig(cors_origins=["http://example.com"], api_key="k"), "m"))
    r = on.options("/v1/completions", headers=pre)      # a preflight carries no key
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.com"
    assert on.get("/v1/models", headers={"Origin": "http://example.com"}).status_code == 401
    assert on.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"] == "m"


def test_freeze_gc_heap_hides_startup_objects_and_frees_dead_ones():
    from llmkern.serve.server import freeze_gc_heap

    class Node:
        pass

    a = Node()
    a.me = a   # a cycle, alive at start-up: only the cyclic collector could free it
    ref = weakref.ref(a)
    try:
        freeze_gc_heap()
        assert gc.get_freeze_count() > 0
        del a
        gc.collect()
        assert ref() is not None   # frozen: full collections no longer walk it
        freeze_gc_heap()           # a later call first frees what died since
        assert ref() is None
    finally:
        gc.unfreeze()
