"""When the router may send a request to a second replica, without processes: Router.forward and
PDRouter.forward against replicas played by an httpx.MockTransport (which records what each replica
was sent) and a stand-in for the launcher's supervisor. A request is tried elsewhere (once) only if
the first replica never ran it (connection refused, 429, 503 shutting_down) or was killed from
outside with nothing streamed; a JSON error or a crash with the request in flight is the client's
answer (502 replica_failed for the crash), and in --pd mode never reaches the decode replica."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from llmkern.router.core import Router  # noqa: E402
from llmkern.router.pd import PDRouter  # noqa: E402
from llmkern.router.supervisor import CRASHED, KILLED, exit_cause  # noqa: E402
from llmkern.serve.errors import APIError  # noqa: E402

A, B, C = "http://a:1", "http://b:1", "http://c:1"
OK = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
      "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "length"}],
      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _resp(status, obj, headers=None) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "application/json", **(headers or {})},
                          stream=httpx.ByteStream(json.dumps(obj).encode()))


def ok(body):
    return _resp(200, OK)


def err(status, code, **kw):
    return lambda body: _resp(status, APIError(status, "failed", code=code).body(), **kw)


def refused(body):
    raise httpx.ConnectError("connection refused")


def broke(body):
    raise httpx.RemoteProtocolError("Server disconnected without sending a response")


class Replicas:
    def __init__(self, answer):
        self.answer = answer
        self.sent = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.sent.append(url)
        return self.answer[url](json.loads(request.content))


class FakeSupervisor:
    def __init__(self, causes):
        self.causes = causes

    async def exit_cause(self, url, wait_s=2.0):
        return self.causes.get(url)


def _wire(router, answer, causes=None):
    reps = Replicas(answer)
    client = httpx.AsyncClient(transport=httpx.MockTransport(reps))
    for sub in ([router.prefill, router.decode] if isinstance(router, PDRouter) else [router]):
        sub.client = client
    for w in router.workers.values():
        w.healthy = True
    if causes is not None:
        router.supervisor = FakeSupervisor(causes)
    return reps


def _dp(answer, causes=None, workers=(A, B)):
    r = Router(list(workers), policy="round_robin")
    return r, _wire(r, answer, causes)


def _call(r, body=None, stream=False):
    body = body or {"prompt": "hi", "max_tokens": 3}

    async def go():
        status, headers, content = await r.forward("/v1/completions", json.dumps(body).encode(), {},
                                                   r.route_request(body, "completion"), stream)
        if not isinstance(content, bytes):
            content = b"".join([c async for c in content])
        return status, headers, content
    return asyncio.run(go())


@pytest.mark.parametrize("status,code", [(500, "request_error"), (500, "engine_error"), (503, "engine_dead"),
                                         (400, None), (503, None)])
def test_a_json_error_is_the_answer_and_never_retried(status, code):
    r, reps = _dp({A: err(status, code), B: err(status, code)})
    got, _, content = _call(r)
    assert got == status and json.loads(content)["error"]["code"] == code
    assert len(reps.sent) == 1                     # the other replica never saw it
    first = r.workers[reps.sent[0]]
    assert first.healthy == (code not in ("engine_error", "engine_dead"))   # a dead engine is taken out


def test_refused_unrun_is_tried_once_elsewhere():
    for first in (refused, err(429, "slo_ttft", headers={"Retry-After": "2"}), err(503, "shutting_down")):
        r, reps = _dp({A: first, B: ok})
        got, _, content = _call(r)
        assert got == 200 and reps.sent == [A, B]
    # At most one more: with three replicas down, two were tried.
    r, reps = _dp({A: refused, B: refused, C: ok}, workers=(A, B, C))
    with pytest.raises(APIError) as e:
        _call(r)
    assert e.value.status == 503 and e.value.code == "all_workers_failed" and reps.sent == [A, B]
    # Every replica refuses unrun: the last refusal (and its Retry-After) is the answer.
    r, reps = _dp({A: err(429, "slo_ttft", headers={"Retry-After": "2"}),
                   B: err(429, "slo_ttft", headers={"Retry-After": "2"})})
    got, headers, _ = _call(r)
    assert got == 429 and headers["retry-after"] == "2"


@pytest.mark.parametrize("causes,retried", [(None, False), ({A: CRASHED}, False), ({A: KILLED}, True)])
def test_broken_connection_is_retried_only_if_killed_from_outside(causes, retried):
    r, reps = _dp({A: broke, B: ok}, causes)
    got, _, content = _call(r)
    if retried:
        assert got == 200 and reps.sent == [A, B] and r.workers[A].retried == 1
    else:
        assert got == 502 and json.loads(content)["error"]["code"] == "replica_failed"
        assert reps.sent == [A] and r.workers[A].failed == 1
    assert not r.workers[A].healthy


def test_exit_causes():
    assert exit_cause(-9) == exit_cause(-15) == exit_cause(0) == KILLED     # someone's signal, or a drain
    assert exit_cause(1) == exit_cause(-11) == exit_cause(-6) == CRASHED


PARAMS = {"engine_id": "e0", "request_id": "r1", "first_token": 5}


def _pd(answer, causes=None):
    r = PDRouter([A], [B])
    return r, _wire(r, answer, causes)


def test_pd_prefill_error_never_reaches_decode():
    for first in (err(500, "request_error"), err(500, "engine_error"), broke):
        r, reps = _pd({A: first, B: ok})
        got, _, content = _call(r)
        assert got in (500, 502) and reps.sent == [A] and r.fallbacks == 0
    # Killed from outside under it, or down: served whole by the decode replica.
    for first, causes in ((broke, {A: KILLED}), (refused, None)):
        r, reps = _pd({A: first, B: ok}, causes)
        got, _, _ = _call(r)
        assert got == 200 and reps.sent == [A, B] and r.fallbacks == 1


@pytest.mark.parametrize("raw, why", [(b"[" * 990 + b"]" * 990, "nested deeper"), (b"{bad", "not valid JSON"),
                                      (b"[1, 2]", "expected a JSON object")])
def test_router_refuses_bad_bodies_before_routing(raw, why):
    """A body the router cannot read is the client's 400 naming the body, decided before any replica
    is chosen (a 990-deep body used to be a 500 from the parser's recursion)."""
    from fastapi.testclient import TestClient

    from llmkern.router.app import build_router_app

    router = Router([A], policy="round_robin", health_interval_s=3600)
    with TestClient(build_router_app(router)) as c:
        r = c.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "body" and why in err["message"]
