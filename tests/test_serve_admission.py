"""Server admission and lifecycle through real server processes: 429 with Retry-After on a full
queue, the queue timeout, the API key, client disconnect freeing KV blocks, SIGTERM drain."""
from __future__ import annotations

import signal
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import httpx  # noqa: E402
import openai  # noqa: E402

from serve_helpers import ServerProcess, tiny_model_dir  # noqa: E402

SMALL = ["--kv-cache-memory-gb", "0.02"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")), max_len=2048)


def _wait(cond, timeout=60.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _bg(fn):
    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_429_on_full_queue_then_queue_timeout_and_api_key(model_dir):
    # A dynamic batch of 4 that never fills (and never times out on its own) keeps the requests
    # queued, so the queue's state does not depend on timing.
    args = ["--model", model_dir, *SMALL, "--scheduler", "dynamic", "--max-batch-size", "4", "--max-wait-ms",
            "1e9", "--max-queued-requests", "2", "--queue-timeout-s", "3", "--api-key", "sesame"]
    with ServerProcess(args) as s:
        assert httpx.get(s.base + "/health", timeout=10).status_code == 200     # no key needed
        r = httpx.get(s.base + "/v1/models", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").completions.create(model="x", prompt="a")
        assert httpx.get(s.base + "/metrics", timeout=10).status_code == 401
        c = s.client(api_key="sesame")
        name = c.models.list().data[0].id
        threads = [_bg(lambda: c.completions.create(model=name, prompt="wait", max_tokens=4)) for _ in range(2)]
        hdr = {"Authorization": "Bearer sesame"}

        _wait(lambda: s.metrics(hdr)[("llmkern:num_requests_waiting", ())] == 2, what="two queued requests")
        r = httpx.post(s.base + "/v1/completions", headers=hdr, json={"model": name, "prompt": "c"}, timeout=10)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert int(r.headers["Retry-After"]) >= 1
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model=name, prompt="c")
        for t, box in threads:   # the queued two fail with the queue timeout, never having started
            t.join(60)
            assert isinstance(box.get("error"), openai.APIStatusError)
            assert box["error"].status_code == 503 and box["error"].body["code"] == "queue_timeout"
        m = s.metrics(hdr)
        assert m[("llmkern:request_rejected_total", (("reason", "queue_full"),))] == 2
        assert m[("llmkern:request_rejected_total", (("reason", "queue_timeout"),))] == 2
        assert m[("llmkern:num_requests_waiting", ())] == 0


def test_disconnect_aborts_and_frees_blocks(model_dir):
    with ServerProcess(["--model", model_dir, *SMALL, "--max-num-seqs", "4"]) as s:
        base = s.metrics()
        assert base[("llmkern:kv_cache_usage_perc", ())] == 0.0
        body = {"model": "x", "prompt": "long", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        body["model"] = s.client().models.list().data[0].id
        with httpx.Client(timeout=30) as h:
            with h.stream("POST", s.base + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                got = 0
                for line in lines:
                    if line.startswith("data: {"):
                        got += 1
                        if got == 3:
                            break
                assert s.metrics()[("llmkern:kv_cache_usage_perc", ())] > 0.0
        # The connection is closed: the request is aborted and its blocks return to the pool.
        _wait(lambda: s.metrics()[("llmkern:num_requests_running", ())] == 0, what="the abort")
        m = s.metrics()
        assert m[("llmkern:kv_cache_usage_perc", ())] == base[("llmkern:kv_cache_usage_perc", ())]
        assert m.get(("llmkern:request_success_total", (("finished_reason", "length"),)), 0) == 0
        # The server keeps serving.
        r = s.client().completions.create(model=body["model"], prompt="after", max_tokens=3)
        assert r.usage.completion_tokens >= 1


def _stream_in_thread(client, name, max_tokens):
    first = threading.Event()

    def run():
        s = client.completions.create(model=name, prompt="drain", max_tokens=max_tokens, stream=True,
                                      extra_body={"ignore_eos": True})
        text, reason = "", None
        for ch in s:
            first.set()
            for c in ch.choices:
                text += c.text
                reason = c.finish_reason or reason
        return text, reason

    t, box = _bg(run)
    return t, box, first


@pytest.mark.parametrize("grace", ["30", "0"])
def test_sigterm_drains_then_exits_zero(model_dir, grace):
    with ServerProcess(["--model", model_dir, *SMALL, "--shutdown-grace-s", grace]) as s:
        c = s.client()
        name = c.models.list().data[0].id
        t, box, first = _stream_in_thread(c, name, 300)
        assert first.wait(60)
        s.signal(signal.SIGTERM)
        if grace != "0":     # while draining, new requests are refused with 503
            r = None
            try:
                r = httpx.post(s.base + "/v1/completions", json={"model": name, "prompt": "new"}, timeout=10)
            except httpx.HTTPError:
                pass     # or the listener is already closed
            assert r is None or r.status_code == 503
        t.join(120)
        assert s.wait(60) == 0, s.output()
        if grace != "0":     # the in-flight request finished normally
            text, reason = box["result"]
            assert reason == "length" and len(text) > 0
        else:                # it was aborted with a final error event
            assert isinstance(box.get("error"), openai.APIError), box
