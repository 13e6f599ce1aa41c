"""`llmkern serve --pd 1P1D` (tiny model, loopback) with a poison request (LLMKERN_FAULT_INJECT
sample:POISON): the prefill replica fails it with a clean 500 `request_error`, which is the client's
answer; it is never sent on to the decode replica (no co-located fallback, no cascade), both
replicas stay up and the next request is handed over as usual; SIGTERM then ends the launcher with
exit code 0. Skipped when the engine has no
fault injection. The launcher and its replicas are reaped by the context manager, also on failure."""
from __future__ import annotations

import importlib.util
import signal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from serve_helpers import ServerProcess, tiny_model_dir, wait_until  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llmkern.engine.faults") is None,
                                reason="the engine has no fault injection (LLMKERN_FAULT_INJECT)")
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory-gb", "0.02", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "512", "--block-size", "16"]


def _workers(srv) -> dict:
    return {w["role"]: w for w in httpx.get(srv.base + "/admin/workers", timeout=10).json()["workers"]}


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
