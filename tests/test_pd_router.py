"""The router's --pd paths without processes: PDRouter.forward against replicas played by an
httpx.MockTransport, which records what each replica was sent. Checks the request each side gets,
which answer the client gets, and the counters of each path (hand-over, fallback, direct, decode
error, finished at the prefill replica)."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from llmkern.router.pd import PDRouter  # noqa: E402
from llmkern.serve.errors import APIError  # noqa: E402

P1, P2, D1 = "http://p1:1", "http://p2:1", "http://d1:1"
PARAMS = {"engine_id": "e0", "request_id": "r1", "first_token": 5}


def _resp(status, obj) -> httpx.Response:
    """A response whose body is streamed, as a real replica's is (the router reads it raw)."""
    return httpx.Response(status, headers={"content-type": "application/json"},
                          stream=httpx.ByteStream(json.dumps(obj).encode()))


def _completion(text, params="absent"):
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(text), "total_tokens": 3 + len(text)}}
    if params != "absent":
        body["kv_transfer_params"] = params
    return body


class Replicas:
    """answer[url] -> callable(body) -> httpx.Response (or raise httpx.ConnectError)."""

    def __init__(self, answer):
        self.answer = answer
        self.sent = []                      # (url, body)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        body = json.loads(request.content)
        self.sent.append((url, body))
        return self.answer[url](body)


def _router(answer, prefill=(P1,), decode=(D1,)):
    r = PDRouter(list(prefill), list(decode))
    reps = Replicas(answer)
    client = httpx.AsyncClient(transport=httpx.MockTransport(reps))
    for sub in (r.prefill, r.decode):
        sub.client = client
    for w in r.workers.values():
        w.healthy = True
    return r, reps


async def _call(r, body, stream=False, kind="completion"):
    raw = json.dumps(body).encode()
    status, headers, content = await r.forward("/v1/completions", raw, {}, r.route_request(body, kind), stream)
    if stream and status == 200 and not isinstance(content, bytes):
        content = b"".join([c async for c in content])
    return status, content


def _down(body):
    raise httpx.ConnectError("connection refused")


def test_hand_over_sends_prefill_then_decode_with_the_params():
    r, reps = _router({P1: lambda b: _resp(200, _completion("a", PARAMS)),
                       D1: lambda b: _resp(200, _completion("abc"))})
    body = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream_options": None}
    status, content = asyncio.run(_call(r, body))
    assert status == 200 and json.loads(content)["choices"][0]["text"] == "abc"
    (pu, pb), (du, db) = reps.sent
    assert pu == P1 and pb["stream"] is False and pb["kv_transfer_params"] == {"do_remote_decode": True}
    assert pb["max_tokens"] == 3 and "stream_options" not in pb   # the prefill side validates the real request
    assert du == D1 and db == dict(body, kv_transfer_params=PARAMS)
    assert (r.pd_requests, r.fallbacks, r.direct, r.decode_errors) == (1, 0, 0, 0)


def test_dead_prefill_replica_is_skipped_then_co_located_fallback():
    r, reps = _router({P1: _down, P2: lambda b: _resp(200, _completion("a", PARAMS)),
                       D1: lambda b: _resp(200, _completion("abc"))}, prefill=(P1, P2))
    status, _ = asyncio.run(_call(r, {"prompt": "hi", "max_tokens": 3}))
    assert status == 200 and [u for u, _ in reps.sent] in ([P1, P2, D1], [P2, D1])
    assert r.pd_requests == 1 and r.fallbacks == 0
    # Now every prefill replica is down or refuses the request unrun (draining): it goes whole (no
    # params) to the decode replica.
    r, reps = _router({P1: _down, P2: lambda b: _resp(503, APIError(503, "busy", code="shutting_down").body()),
                       D1: lambda b: _resp(200, _completion("abc"))}, prefill=(P1, P2))
    status, content = asyncio.run(_call(r, {"prompt": "hi", "max_tokens": 3}))
    assert status == 200 and json.loads(content)["choices"][0]["text"] == "abc"
    assert reps.sent[-1] == (D1, {"prompt": "hi", "max_tokens": 3})
    assert r.fallbacks == 1 and r.pd_requests == 0
    assert sum(w.retried for w in r.prefill.workers.values()) == 2


def test_client_errors_come_back_from_the_prefill_replica():
    err = APIError(400, "top_p: expected a number in (0, 1], got 7", param="top_p").body()
    r, reps = _router({P1: lambda b: _resp(400, err), D1: _down})
    status, content = asyncio.run(_call(r, {"prompt": "hi", "top_p": 7}))
    assert status == 400 and json.loads(content)["error"]["param"] == "top_p"
    assert [u for u, _ in reps.sent] == [P1] and r.fallbacks == 0


def test_decode_side_failures():
    # The decode replica refuses the hand-over (e.g. expired): served whole there instead.
    refuse = APIError(400, "kv_transfer_params: expired 1.0 s ago", param="kv_transfer_params").body()
    r, reps = _router({P1: lambda b: _resp(200, _completion("a", PARAMS)),
                       D1: lambda b: _resp(400, refuse) if "kv_transfer_params" in b
                       else _resp(200, _completion("abc"))})
    status, content = asyncio.run(_call(r, {"prompt": "hi", "max_tokens": 3}))
    assert status == 200 and json.loads(content)["choices"][0]["text"] == "abc" and r.fallbacks == 1
    # No decode replica answers: a clear error object, counted.
    r, _ = _router({P1: lambda b: _resp(200, _completion("a", PARAMS)), D1: _down})
    with pytest.raises(APIError) as e:
        asyncio.run(_call(r, {"prompt": "hi", "max_tokens": 3}))
    assert e.value.status == 503 and e.value.code == "decode_unavailable" and r.decode_errors == 1


def test_not_handed_over_requests_go_whole_to_decode():
    r, reps = _router({P1: _down, D1: lambda b: _resp(200, _completion("ab"))})
    for body in ({"prompt": "hi", "n": 2}, {"prompt": ["a", "b"]}):
        status, _ = asyncio.run(_call(r, body))
        assert status == 200 and reps.sent[-1] == (D1, body)
    assert r.direct == 2 and not [u for u, _ in reps.sent if u == P1]


def test_finished_at_prefill_is_answered_as_a_stream():
    """A prefill answer without params (nothing to hand over, e.g. max_tokens 0) is the whole answer;
    a streaming client gets it as the chunks a streaming server sends."""
    resp = _completion("", None)
    resp["object"] = "chat.completion"
    resp["choices"] = [{"index": 0, "message": {"role": "assistant", "content": "x"}, "logprobs": None,
                        "finish_reason": "length"}]
    r, reps = _router({P1: lambda b: _resp(200, resp), D1: _down})
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}
    status, content = asyncio.run(_call(r, body, stream=True, kind="chat"))
    events = [e[6:] for e in content.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "x"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"] == resp["usage"] and r.finished_at_prefill == 1 and len(reps.sent) == 1
