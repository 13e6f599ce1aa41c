"""PDRouter: the router's prefill-decode mode (`llmkern router --pd --prefill URL --decode URL`).

A request goes first to a prefill replica (`llmkern serve --role prefill`), unchanged but for
`stream: false` and `kv_transfer_params: {"do_remote_decode": true}`: that replica validates it
exactly as a co-located server would, computes the prompt's KV and the first token, and answers
with an ordinary response plus a top-level `kv_transfer_params` object. The router then sends the
original request, with those params added, to a decode replica (`--role decode`), which receives
the KV blocks, emits the first token and streams the rest: the client sees that one response.

Each pool is an ordinary Router (health checks, KV events, the policy, retries before anything
streamed: see core.py), so prefix-aware placement works on both sides. Failures:
  - no prefill replica could take it (down, refused it unrun, or killed from outside under it):
    the request is sent whole to a decode replica, which prefills it itself (co-located fallback);
  - the prefill replica answered an error (the request's own, or its engine died under it) or
    crashed with the request in flight: that error is the client's answer; it is never sent on to
    a decode replica, so one bad request cannot take down both sides;
  - decode replica down before streaming: the next decode replica (the prefill side keeps the
    blocks until its transfer deadline, then frees them); with none left, a 503 error object;
  - decode replica lost mid-stream: an OpenAI error event and [DONE] (the Router's relay).
Requests the hand-over does not cover (n > 1, several prompts in one completion) go whole to a
decode replica. /metrics counts each path."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..serve.errors import APIError
from .core import Router, refused_unrun
from .policies import RouteRequest

log = logging.getLogger("llmkern.router")

ROLES = ("prefill", "decode")


@dataclass
class PDRequest:
    """What route_request hands to forward: the parsed body, its kind and its routing hint."""
    body: Optional[dict]
    kind: str
    route: RouteRequest


class PDRouter:
    """Duck-types Router for build_router_app: start/stop, workers, route_request, forward,
    get_json, add_worker/remove_worker, policy."""

    def __init__(self, prefill: List[str], decode: List[str], policy: str = "cache_aware", tokenizer=None,
                 request_timeout_s: float = 600.0, health_interval_s: float = 1.0):
        if not decode:
            raise ValueError("decode: --pd needs at least one decode replica (--decode URL)")
        kw = dict(policy=policy, tokenizer=tokenizer, request_timeout_s=request_timeout_s,
                  health_interval_s=health_interval_s)
        self.prefill = Router(prefill, **kw)
        self.decode = Router(decode, **kw)
        overlap = set(self.prefill.workers) & set(self.decode.workers)
        if overlap:
            raise ValueError(f"worker: {sorted(overlap)[0]} is given as both a prefill and a decode replica")
        self.policy = self.decode.policy
        self.tokenizer = tokenizer
        self.pd_requests = 0         # requests that went prefill -> decode
        self.finished_at_prefill = 0  # answered by the prefill replica alone (first token was the last)
        self.fallbacks = 0           # prefill pool unavailable: sent whole to a decode replica
        self.direct = 0              # not covered by the hand-over (n > 1, batches): sent whole
        self.decode_errors = 0       # decode pool unavailable after a successful prefill

    # -- registry ---------------------------------------------------------------------------------
    @property
    def supervisor(self):
        return self.prefill.supervisor

    @supervisor.setter
    def supervisor(self, sup) -> None:
        self.prefill.supervisor = self.decode.supervisor = sup

    @property
    def workers(self) -> Dict[str, object]:
        return {**self.prefill.workers, **self.decode.workers}

    def role_of(self, url: str) -> Optional[str]:
        url = url.rstrip("/")
        return "prefill" if url in self.prefill.workers else "decode" if url in self.decode.workers else None

    async def start(self) -> None:
        await self.prefill.start()
        await self.decode.start()

    async def stop(self) -> None:
        await self.prefill.stop()
        await self.decode.stop()

    async def add_worker(self, url: str, role: Optional[str] = None):
        if role not in ROLES:
            raise ValueError(f"role: in --pd mode a worker is added with \"role\": \"prefill\" or \"decode\", "
                             f"got {role!r}")
        if url.rstrip("/") in self.workers:
            raise ValueError(f"worker: {url.rstrip('/')} is already registered")
        return await (self.prefill if role == "prefill" else self.decode).add_worker(url)

    async def remove_worker(self, url: str) -> None:
        role = self.role_of(url)
        if role is None:
            raise APIError(404, f"url: no worker {url!r} is registered", param="url")
        await (self.prefill if role == "prefill" else self.decode).remove_worker(url)

    async def get_json(self, path: str, headers: Dict[str, str]):
        return await self.decode.get_json(path, headers)

    # -- routing and forwarding -------------------------------------------------------------------
    def route_request(self, body: dict, kind: str) -> PDRequest:
        return PDRequest(body, kind, self.decode.route_request(body, kind))

    @staticmethod
    def _handed_over(body: dict, kind: str) -> bool:
        """Whether the hand-over covers this request: one prompt, one choice."""
        n = body.get("n")
        if n not in (None, 1):
            return False
        if kind == "completion":
            p = body.get("prompt")
            if isinstance(p, list) and p and not isinstance(p[0], int):
                return len(p) == 1
        return True

    async def forward(self, path: str, raw: bytes, headers: Dict[str, str], req: PDRequest, stream: bool):
        body = req.body
        if not self._handed_over(body, req.kind):
            self.direct += 1
            return await self.decode.forward(path, raw, headers, req.route, stream)
        pbody = {k: v for k, v in body.items() if k != "stream_options"}
        pbody.update(stream=False, kv_transfer_params={"do_remote_decode": True})
        try:
            status, hdrs, content = await self.prefill.forward(path, json.dumps(pbody).encode(), headers,
                                                               req.route, False)
        except APIError as e:            # no prefill replica could take it (none ran it to an answer)
            status, content = e.status, None
        if status != 200:
            if content is not None and not refused_unrun(status, content):
                return status, hdrs, content     # the request's own answer (an error): no cascade
            self.fallbacks += 1
            log.warning("llmkern router: prefill pool unavailable (%s): request served co-located", status)
            return await self.decode.forward(path, raw, headers, req.route, stream)
        resp = json.loads(content)
        params = resp.pop("kv_transfer_params", None)
        if params is None:                       # finished at its first token: nothing to hand over
            self.finished_at_prefill += 1
            if not stream:
                return 200, {"content-type": "application/json"}, json.dumps(resp).encode()
            return 200, {"cache-control": "no-cache"}, _as_stream(resp, req.kind, body)
        self.pd_requests += 1
        dbody = dict(body, kv_transfer_params=params)
        try:
            out = await self.decode.forward(path, json.dumps(dbody).encode(), headers, req.route, stream)
        except APIError as e:
            self.decode_errors += 1
            raise APIError(503, f"the prompt was prefilled but no decode replica could continue it ({e.message})",
                           code="decode_unavailable") from None
        if out[0] >= 500:
            self.decode_errors += 1
        elif out[0] == 400 and b'"kv_transfer_params"' in out[2]:
            # The decode side cannot use the hand-over (expired, other geometry, peer unreachable):
            # not the client's fault, so it is served whole there instead.
            self.fallbacks += 1
            log.warning("llmkern router: decode replica refused the hand-over: request served co-located")
            return await self.decode.forward(path, raw, headers, req.route, stream)
        return out

    # -- what /metrics reads ----------------------------------------------------------------------
    @property
    def routed_prompt_tokens(self) -> int:
        return self.decode.routed_prompt_tokens

    @property
    def routed_cached_tokens(self) -> int:
        return self.decode.routed_cached_tokens

    @property
    def no_worker_errors(self) -> int:
        return self.prefill.no_worker_errors + self.decode.no_worker_errors

    def pd_counters(self):
        """(metric name, help, value) of the prefill-decode paths, for /metrics."""
        return [("llmkern_router_pd_requests", "requests prefilled on a prefill replica and continued on a "
                                               "decode replica", self.pd_requests),
                ("llmkern_router_pd_finished_at_prefill", "requests whose first token was their last (answered "
                                                          "by the prefill replica)", self.finished_at_prefill),
                ("llmkern_router_pd_fallbacks", "requests served whole by a decode replica because no prefill "
                                                "replica answered", self.fallbacks),
                ("llmkern_router_pd_direct", "requests the hand-over does not cover (n > 1, several prompts), "
                                             "served whole by a decode replica", self.direct),
                ("llmkern_router_pd_decode_errors", "prefilled requests no decode replica could continue "
                                                    "(the client got an error)", self.decode_errors)]


async def _as_stream(resp: dict, kind: str, body: dict):
    """A complete response as the SSE chunks a streaming server would have sent for it."""
    def sse(obj) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = {"id": resp.get("id"), "created": resp.get("created"), "model": resp.get("model"),
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion"}
    extra = {"usage": None} if include_usage else {}
    for c in resp.get("choices", []):
        i = c.get("index", 0)
        if kind == "chat":
            text = (c.get("message") or {}).get("content") or ""
            yield sse(dict(base, choices=[{"index": i, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}], **extra))
            if text:
                yield sse(dict(base, choices=[{"index": i, "delta": {"content": text},
                                               "logprobs": c.get("logprobs"), "finish_reason": None}], **extra))
            yield sse(dict(base, choices=[{"index": i, "delta": {}, "logprobs": None,
                                           "finish_reason": c.get("finish_reason")}], **extra))
        else:
            yield sse(dict(base, choices=[{"index": i, "text": c.get("text", ""), "logprobs": c.get("logprobs"),
                                           "finish_reason": c.get("finish_reason")}], **extra))
    if include_usage:
        yield sse(dict(base, choices=[], usage=resp.get("usage")))
    yield b"data: [DONE]\n\n"
