"""build_router_app(router): the router's FastAPI app. The same OpenAI routes as a replica
(POST /v1/completions, /v1/chat/completions, GET /v1/models), GET /health (200 while a worker is
healthy), GET /metrics (per-worker requests, retries, failures, health, load), and the admin
routes GET/POST/DELETE /admin/workers to list, add and remove workers at run time.

app.state.drain is the RouterDrain run_router's server uses on SIGTERM: from then on new requests
(and /health) get 503 with Retry-After while those in flight finish."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from types import SimpleNamespace
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..serve.errors import APIError, install_error_handlers, json_response
from ..serve.json_body import parse_object
from .core import Router
from .metrics import render_metrics

log = logging.getLogger("llmkern.router")
MAX_BODY = 8 << 20
_FORWARD = ("authorization", "content-type")


class RouterDrain:
    """The requests this router has in flight, and the drain on SIGTERM (what serve's draining
    uvicorn server calls: drain(grace_s) with cfg.shutdown_grace_s)."""

    def __init__(self, grace_s: float, supervisor=None):
        self.cfg = SimpleNamespace(shutdown_grace_s=grace_s)
        self.supervisor = supervisor
        self.draining = False
        self.inflight = 0

    def refuse(self) -> None:
        if self.draining:
            raise APIError(503, "the router is shutting down; retry on another server", code="shutting_down",
                           headers={"Retry-After": "1"})

    async def drain(self, grace_s: float) -> None:
        self.draining = True
        if self.supervisor is not None:      # replicas that exit now stay down: they are being stopped
            self.supervisor.stopping = True
        log.warning("llmkern router: draining (%d request(s) in flight)", self.inflight)
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def counted(self, chunks):
        """A response stream, counted in flight until it ends."""
        try:
            async for c in chunks:
                yield c
        finally:
            self.inflight -= 1


def build_router_app(router: Router, admin_key: Optional[str] = None, supervisor=None,
                     grace_s: float = 30.0) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        if supervisor is not None:
            router.supervisor = supervisor        # why a replica's connection broke: see core.Router
            supervisor.start(router)
        await router.start()
        try:
            yield
        finally:
            if supervisor is not None:
                await supervisor.stop_watching()
            await router.stop()

    app = FastAPI(title="llmkern router", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.router = router
    drain = app.state.drain = RouterDrain(grace_s, supervisor)

    install_error_handlers(app, log, "llmkern router")

    @app.get("/health")
    async def health():
        if drain.draining:
            return json_response(APIError(503, "the router is shutting down", code="shutting_down",
                                          headers={"Retry-After": "1"}))
        if not any(w.healthy for w in router.workers.values()):
            return json_response(APIError(503, "no healthy worker", code="no_workers"))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(render_metrics(router), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        status, body = await router.get_json("/v1/models", _headers(request))
        return Response(body, status_code=status, media_type="application/json")

    async def generate(request: Request, path: str, kind: str):
        drain.refuse()
        drain.inflight += 1
        handed_over = False
        try:
            status, headers, content, stream = await _generate(request, path, kind)
            if status == 200 and stream:
                handed_over = True
                return StreamingResponse(drain.counted(content), media_type="text/event-stream", headers=headers)
            return Response(content, status_code=status, headers=headers)
        finally:
            if not handed_over:
                drain.inflight -= 1

    async def _generate(request: Request, path: str, kind: str):
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise APIError(413, f"body: larger than the limit of {MAX_BODY} bytes", param="body",
                           code="body_too_large")
        body = parse_object(raw)   # nesting checked before parsing: a 400, never a RecursionError
        stream = body.get("stream") is True
        req = router.route_request(body, kind)
        status, headers, content = await router.forward(path, raw, _headers(request), req, stream)
        return status, headers, content, stream

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "/v1/completions", "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "/v1/chat/completions", "chat")

    def _admin(request: Request) -> None:
        if admin_key is None:
            return
        auth = request.headers.get("x-admin-key", "")
        if not hmac.compare_digest(auth.encode(), admin_key.encode()):
            raise APIError(401, "admin: missing or invalid X-Admin-Key header", code="invalid_admin_key")

    @app.get("/admin/workers")
    async def list_workers(request: Request):
        _admin(request)
        role_of = getattr(router, "role_of", None)   # --pd mode: each worker's role too
        def info(w):
            d = w.info()
            if role_of:
                d["role"] = role_of(w.url)
            if supervisor is not None:       # the replica process: pid, restarts, exits by cause
                d.update(supervisor.info(w.url))
            return d
        return {"policy": router.policy.name, "workers": [info(w) for w in router.workers.values()]}

    @app.post("/admin/workers")
    async def add_worker(request: Request):
        _admin(request)
        try:
            body = json.loads(await request.body() or b"null")
            url = body["url"]
        except (ValueError, TypeError, KeyError):
            raise APIError(400, "body: expected {\"url\": \"http://host:port\"}", param="url")
        pd = hasattr(router, "role_of")   # --pd mode: {"url", "role": "prefill"|"decode"}
        if "role" in body and not pd:
            raise APIError(400, "role: only a router in --pd mode takes a worker role", param="role")
        try:
            w = await (router.add_worker(url, body.get("role")) if pd else router.add_worker(url))
        except ValueError as e:
            raise APIError(400, str(e), param="role" if str(e).startswith("role") else "url")
        return JSONResponse(w.info(), status_code=201)

    @app.delete("/admin/workers")
    async def remove_worker(request: Request, url: str = ""):
        _admin(request)
        await router.remove_worker(url)
        return Response(status_code=204)

    return app


def _headers(request: Request) -> dict:
    return {k: v for k, v in request.headers.items() if k.lower() in _FORWARD}
