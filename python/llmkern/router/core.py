"""Router: the registry of workers, the routing decision (tokenise once, rank with the policy) and
forwarding.

A request is forwarded byte for byte (the replica validates it and answers). A request is tried on
a second replica (at most one more, so one request can never take down a cluster) only when the
first one certainly did not fail because of it: the connection was refused (the replica is down;
nothing was sent), the replica refused it unrun (429, or 503 `shutting_down`), or the launcher's
supervisor says the replica was killed from outside and nothing had been streamed. Any other
answer, a JSON error included (`request_error`, `engine_error`, any 4xx/5xx), is the client's
answer; a connection that broke while the request was in flight there gives a 502 `replica_failed`
error object; a stream that breaks ends with that error as an event and [DONE]: the client knows,
nothing is silently lost and nothing hangs. A replica that is down, dead or draining is taken out at
once (its health check takes it back)."""
from __future__ import annotations

import json
import logging
from typing import AsyncIterator, Dict, List, Optional, Tuple

import httpx

from ..serve.errors import APIError
from .kv_zmq import parse_worker_spec
from .policies import RouteRequest, make_policy
from .supervisor import KILLED
from .worker import Worker

log = logging.getLogger("llmkern.router")

_TRANSPORT_ERRORS = (httpx.TransportError,)
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)   # the request never reached the replica
MAX_ATTEMPTS = 2
# Error codes of a replica that is gone or going: it is taken out of the ranking at once.
_DOWN_CODES = ("engine_error", "engine_dead", "shutting_down")


def _error_code(body: bytes) -> Optional[str]:
    try:
        return (json.loads(body).get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return None


def refused_unrun(status: int, body: bytes) -> bool:
    """Whether a replica's error answer says it refused the request without running it (back-pressure
    or a drain): the one kind of JSON error another replica may be asked to serve."""
    return status == 429 or (status == 503 and _error_code(body) == "shutting_down")


def replica_failed(why: str) -> APIError:
    return APIError(502, f"the replica serving this request failed ({why}); the request was not retried "
                         "elsewhere, as it may have caused the failure", code="replica_failed")


class Router:
    supervisor = None      # the launcher's ReplicaSupervisor, when it has one: exit_cause(url)

    def __init__(self, workers: List[str], policy: str = "cache_aware", tokenizer=None,
                 request_timeout_s: float = 600.0, health_interval_s: float = 1.0, policy_args: Optional[dict] = None):
        self.policy = make_policy(policy, **(policy_args or {}))
        self.tokenizer = tokenizer
        self.request_timeout_s = request_timeout_s
        self.health_interval_s = health_interval_s
        self.workers: Dict[str, Worker] = {}
        self.client: Optional[httpx.AsyncClient] = None
        self.no_worker_errors = 0
        self.routed_prompt_tokens = 0       # prompt tokens routed
        self.routed_cached_tokens = 0       # ... found in the chosen worker's cache at routing time
        for url in workers:
            self._make(url)

    # -- lifecycle and registry -------------------------------------------------------------------
    def _make(self, spec: str) -> Worker:
        url, zmq_events = parse_worker_spec(spec)    # URL[,zmq=ENDPOINT,replay=ENDPOINT,topic=T]
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"worker: expected an http(s):// URL, got {url!r}")
        w = Worker(url, health_interval_s=self.health_interval_s, zmq_events=zmq_events)
        if w.url in self.workers:
            raise ValueError(f"worker: {w.url} is already registered")
        self.workers[w.url] = w
        return w

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(self.request_timeout_s, connect=5.0))
        for w in self.workers.values():
            w.start(self.client)
            await w.check_health(self.client)

    async def stop(self) -> None:
        for w in self.workers.values():
            await w.stop()
        if self.client is not None:
            await self.client.aclose()

    async def add_worker(self, url: str) -> Worker:
        w = self._make(url)
        if self.client is not None:
            w.start(self.client)
            await w.check_health(self.client)
        return w

    async def remove_worker(self, url: str) -> None:
        w = self.workers.pop(url.rstrip("/"), None)
        if w is None:
            raise APIError(404, f"url: no worker {url!r} is registered", param="url")
        await w.stop()
        forget = getattr(self.policy, "forget", None)
        if forget is not None:
            forget(w.url)

    # -- routing ----------------------------------------------------------------------------------
    def route_request(self, body: dict, kind: str) -> RouteRequest:
        """The prompt as tokens (for the KV match) and as text (for approx_tree). A body the router
        cannot read is still forwarded: the replica answers with the precise error."""
        ids: List[int] = []
        text = ""
        tok = self.tokenizer
        try:
            if kind == "chat":
                msgs = [{"role": m["role"], "content": _content(m.get("content"))} for m in body["messages"]]
                if tok is not None:
                    text = tok.apply_chat_template(msgs)
                    ids = tok.encode_chat(msgs)
                else:
                    text = "".join(m["content"] for m in msgs)
            else:
                p = body.get("prompt")
                if isinstance(p, list) and p and not isinstance(p[0], int):
                    p = p[0]                # a batch of prompts: routed together, by the first
                if isinstance(p, str):
                    text = p
                    ids = tok.encode(p) if tok is not None else []
                elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                    ids = list(p)
                    text = " ".join(map(str, p))
        except Exception:  # noqa: B902 - any malformed body: no routing hint, the replica reports it
            ids, text = [], ""
        return RouteRequest(ids, text)

    def rank(self, req: RouteRequest) -> List[Worker]:
        live = [w for w in self.workers.values() if w.healthy]
        if not live:
            return []
        ranked = self.policy.rank(req, live)
        if req.token_ids:
            self.routed_prompt_tokens += len(req.token_ids)
            self.routed_cached_tokens += int(round(req.cached_fraction(ranked[0]) * len(req.token_ids)))
        return ranked

    @staticmethod
    def note_sent(w: Worker, req: RouteRequest) -> None:
        """Count a request sent to w: in flight there, its blocks about to be cached there."""
        w.requests += 1
        w.inflight += 1
        if req.token_ids and w.kv.synced:
            new = len(req.token_ids) - int(req.cached_fraction(w) * len(req.token_ids))
            w.kv.note_routed(req.hashes(w.kv.block_size), new)

    @staticmethod
    def note_done(w: Worker, req: RouteRequest) -> None:
        """A request sent to w ended (finished, failed or handed to the next worker)."""
        w.inflight -= 1
        if req.token_ids and w.kv.block_size:
            w.kv.settle(req.hashes(w.kv.block_size))

    # -- forwarding -------------------------------------------------------------------------------
    async def forward(self, path: str, raw: bytes, headers: Dict[str, str], req: RouteRequest, stream: bool):
        """(status, headers, body bytes) or (200, headers, async iterator of bytes) for a stream.
        APIError 503 when no replica could take the request (none healthy, or every one tried was
        down, refused it or was killed from outside under it)."""
        ranked = self.rank(req)
        if not ranked:
            self.no_worker_errors += 1
            raise APIError(503, "no healthy worker is available", code="no_workers")
        last: Optional[Tuple[int, Dict[str, str], bytes]] = None
        for w in ranked[:MAX_ATTEMPTS]:
            self.note_sent(w, req)
            handed_over = False
            try:
                req_ = self.client.build_request("POST", w.url + path, content=raw, headers=headers)
                resp = await self.client.send(req_, stream=True)
                try:
                    if resp.status_code != 200:
                        body = await resp.aread()
                        code = _error_code(body)
                        if code in _DOWN_CODES:
                            w.mark_down(f"answered {resp.status_code} {code}")
                        if refused_unrun(resp.status_code, body):
                            last = (resp.status_code, _json_headers(resp), body)
                            w.retried += 1
                            continue
                        return resp.status_code, _json_headers(resp), body
                    chunks = resp.aiter_raw()
                    first = await chunks.__anext__()     # the replica has answered: no retry after this
                    if not stream:
                        rest = b"".join([c async for c in chunks])
                        return 200, _json_headers(resp), first + rest
                    handed_over = True
                    return 200, {"cache-control": "no-cache"}, self._relay(w, req, resp, first, chunks)
                finally:
                    if not handed_over:
                        await resp.aclose()
            except _NOT_SENT as e:
                w.mark_down(type(e).__name__)
                w.retried += 1
                continue
            except (_TRANSPORT_ERRORS + (StopAsyncIteration,)) as e:
                w.mark_down(f"connection broke: {type(e).__name__}")
                cause = await self._exit_cause(w)
                if cause == KILLED:        # not this request's doing, and nothing reached the client
                    w.retried += 1
                    last = None
                    continue
                w.failed += 1
                err = replica_failed(f"{type(e).__name__}" + (f", the replica {cause}" if cause else ""))
                return err.status, {"content-type": "application/json"}, json.dumps(err.body()).encode()
            finally:
                if not handed_over:
                    self.note_done(w, req)
        if last is not None:
            return last
        raise APIError(503, f"the request could not be served by the worker(s) tried "
                            f"({min(len(ranked), MAX_ATTEMPTS)})", code="all_workers_failed")

    async def _exit_cause(self, w: Worker) -> Optional[str]:
        sup = self.supervisor
        return None if sup is None else await sup.exit_cause(w.url)

    async def _relay(self, w: Worker, req: RouteRequest, resp: httpx.Response, first: bytes,
                     chunks) -> AsyncIterator[bytes]:
        try:
            yield first
            async for c in chunks:
                yield c
        except _TRANSPORT_ERRORS as e:
            w.failed += 1
            w.mark_down(f"stream broke: {type(e).__name__}")
            err = APIError(502, f"the replica serving this request failed mid-stream ({type(e).__name__}); "
                                "the output is incomplete", code="replica_failed")
            yield f"\n\ndata: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
        finally:
            self.note_done(w, req)
            await resp.aclose()

    async def get_json(self, path: str, headers: Dict[str, str]):
        for w in self.workers.values():
            if not w.healthy:
                continue
            try:
                r = await self.client.get(w.url + path, headers=headers, timeout=10)
                return r.status_code, r.content
            except _TRANSPORT_ERRORS as e:
                w.mark_down(type(e).__name__)
        raise APIError(503, "no healthy worker is available", code="no_workers")


def _content(c) -> str:
    if isinstance(c, list):
        return "".join(p["text"] for p in c)
    return "" if c is None else c


def _json_headers(resp: httpx.Response) -> Dict[str, str]:
    out = {"content-type": resp.headers.get("content-type", "application/json")}
    if "retry-after" in resp.headers:
        out["retry-after"] = resp.headers["retry-after"]
    return out
