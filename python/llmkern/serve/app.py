"""build_app(loop, config): the FastAPI app. Routes: POST /v1/completions, POST
/v1/chat/completions, GET /v1/models, GET /health, GET /metrics, GET /openapi.json (the bodies,
from openapi.py), the tokenizer's (tokenizer_routes.py), and for routers GET /kv/snapshot and GET /kv/events (SSE) with the prefix cache's
block events and the replica's load. A plain ASGI guard in front checks the API key and the
declared body size before any route runs."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.param_checks import INT32_MAX
from . import openapi
from .admission import Admission
from .config import ServeConfig
from .errors import APIError, from_value_error, install_error_handlers, json_response
from .json_body import read_json
from .kv_events import KVEventPublisher
from .metrics import ServeMetrics
from .pd import RoleHooks, engine_role
from .protocol import check_model, completion_response, parse_chat, parse_completion
from .streaming import Run, final_outputs, first_item, stream_events
from .tokenizer_routes import add_tokenizer_routes

log = logging.getLogger("llmkern.serve")


class ServerState:
    """What the routes share: the engine loop, settings, metrics, admission, the drain flag."""

    def __init__(self, loop, cfg: ServeConfig, model_name: str):
        self.loop, self.cfg, self.model_name = loop, cfg, model_name
        eng = loop.engine
        self.max_tokens_limit = cfg.max_tokens_limit or eng.max_model_len
        self.metrics = ServeMetrics(loop, model_name)
        self.admission = Admission(cfg, loop, self.metrics)
        self.draining = False
        self.pd = RoleHooks(engine_role(eng))   # prefill / decode / both
        self.created = int(time.time())
        kv = getattr(eng, "kv", None)       # an engine without a paged cache publishes nothing
        self.kv_events = KVEventPublisher(kv.block_size if kv is not None else 0)
        self.kv_events_zmq = None
        if kv is not None:
            self.kv_events.attach(eng)
            if cfg.kv_events_config is not None and cfg.kv_events_config.active:
                from .kv_events_zmq import ZmqKVEventSink   # pyzmq and msgpack only when asked for

                self.kv_events_zmq = ZmqKVEventSink(cfg.kv_events_config, kv.block_size)
                self.kv_events.connect_sink(self.kv_events_zmq)

    def load(self) -> dict:
        """What a router weighs against cache hits: requests waiting and running, prompt tokens
        still to prefill (queued in the engine or not yet handed to it), KV blocks in use, and the
        measured prefill rate (tokens/s; None before the first prefill)."""
        st, pend_reqs, pend_tokens = self.loop.load()
        used = st.kv_blocks_total - st.kv_blocks_free
        return {"num_waiting": st.num_waiting + pend_reqs, "num_running": st.num_running,
                "prefill_tokens_pending": st.prefill_tokens_pending + pend_tokens,
                "kv_usage": used / st.kv_blocks_total if st.kv_blocks_total else 0.0,
                "kv_blocks_total": st.kv_blocks_total, "prefill_tok_s": st.prefill_tok_s}

    async def drain(self, grace_s: float) -> None:
        """Stop accepting (503), let in-flight requests finish for up to grace_s, then abort the
        rest with a final error."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while self.loop.num_active and time.monotonic() < deadline and self.loop.alive:
            await asyncio.sleep(0.05)
        if self.loop.num_active:
            self.loop.abort_all(APIError(503, "the server is shutting down", code="shutting_down"))
            end = time.monotonic() + 5
            while self.loop.num_active and time.monotonic() < end and self.loop.alive:
                await asyncio.sleep(0.02)


class _Guard:
    """API key (every path but /health) and Content-Length limit, before FastAPI sees the request."""

    def __init__(self, app, cfg: ServeConfig):
        self.app, self.cfg = app, cfg
        self.key = cfg.api_key.encode() if cfg.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        err = None
        if self.key is not None and scope.get("path") != "/health":
            auth = headers.get(b"authorization", b"")
            if not (auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), self.key)):
                err = APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                               code="invalid_api_key")
        cl = headers.get(b"content-length")
        if err is None and cl is not None:
            try:
                too_big = int(cl) > self.cfg.max_body_bytes
            except ValueError:
                too_big = False
            if too_big:
                err = APIError(413, f"body: {int(cl)} bytes, the limit is {self.cfg.max_body_bytes}",
                               param="body", code="body_too_large")
        if err is None:
            return await self.app(scope, receive, send)
        body = json.dumps(err.body()).encode()
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": err.status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})


async def _until_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def build_app(loop, cfg: Optional[ServeConfig] = None, model_name: Optional[str] = None) -> FastAPI:
    """The OpenAI-compatible app over a started EngineLoop. app.state.llmkern holds the
    ServerState (drain(), metrics)."""
    cfg = cfg or ServeConfig()
    name = model_name or cfg.served_model_name or "llmkern"
    state = ServerState(loop, cfg, name)
    app = FastAPI(title="llmkern", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.llmkern = state

    install_error_handlers(app, log, "llmkern")

    @app.get("/health")
    async def health():
        if not loop.alive:
            return json_response(APIError(503, "the engine loop is not running", code="engine_dead"))
        if state.draining:
            return json_response(APIError(503, "the server is shutting down", code="shutting_down"))
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": state.created,
                                            "owned_by": "llmkern", "max_model_len": loop.engine.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/kv/snapshot")
    async def kv_snapshot():
        return dict(state.kv_events.snapshot(), load=state.load())

    @app.get("/kv/events")
    async def kv_events(since: int = 0):
        return StreamingResponse(_kv_stream(state, since), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def generate(request: Request, kind: str):
        if state.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        body = await read_json(request, cfg.max_body_bytes)
        check_model(body.get("model"), name)
        parse = parse_chat if kind == "chat" else parse_completion
        req = parse(body, loop.engine, cfg.max_n, state.max_tokens_limit)
        so = req.params.structured_outputs
        if so is not None:   # compiled off the event loop; the engine then finds it cached
            try:
                await asyncio.to_thread(loop.engine.structured.compile, so)
            except ValueError as e:
                raise from_value_error(e)
        extra = state.pd.submit_kwargs(body, req)
        state.admission.check(len(req.prompts), sum(len(ids) for _, ids in req.prompts))
        now = time.perf_counter()
        deadline = now + cfg.queue_timeout_s if cfg.queue_timeout_s else None
        handles = [loop.submit(ids, req.params, stream=req.stream, priority=req.priority, queue_deadline=deadline,
                               arrival_time=now, **extra) for _, ids in req.prompts]
        run = Run(loop, handles)
        watch = asyncio.ensure_future(_until_disconnect(request))
        streaming = False
        try:
            work = asyncio.ensure_future(first_item(run) if req.stream else final_outputs(run))
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():        # the client left: its requests are aborted in finally
                work.cancel()
                return Response(status_code=499)
            result = work.result()     # raises the request's APIError
            if not req.stream:
                return JSONResponse(state.pd.response(completion_response(req, name, result, loop.engine.tokenizer),
                                                      result))
            streaming = True           # the stream owns `run` now (it aborts on disconnect)
            return StreamingResponse(stream_events(req, name, run, result, loop.engine.tokenizer),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        finally:
            watch.cancel()
            if not streaming:
                run.close()

    vocab = getattr(getattr(loop.engine, "model_config", None), "vocab_size", INT32_MAX + 1)
    limits = (state.max_tokens_limit, cfg.max_n, vocab)

    @app.post("/v1/completions", openapi_extra=openapi.route_extra(openapi.completion_request(*limits)))
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions", openapi_extra=openapi.route_extra(openapi.chat_request(*limits)))
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    add_tokenizer_routes(app, loop.engine, name, cfg.max_body_bytes)
    app.add_middleware(_Guard, cfg=cfg)
    if cfg.cors_origins:   # outermost, so that preflight requests (which carry no key) are answered
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cfg.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    return app


async def _kv_stream(state: ServerState, since: int, poll_s: float = 0.02, heartbeat_s: float = 0.25):
    """SSE: {"seq", "events": [[seq, "stored"|"removed", hash], ...], "load"} whenever events
    arrive (and every heartbeat_s with the load); {"reset": true, "seq"} when events after `since`
    are gone, after which the reader takes a snapshot and reconnects."""
    last, quiet = since, heartbeat_s
    while not state.draining:       # a draining server closes the stream (uvicorn waits for open responses)
        events, cur = state.kv_events.since(last)
        if events is None:
            yield f"data: {json.dumps({'reset': True, 'seq': cur})}\n\n"
            return
        if events or quiet >= heartbeat_s:
            yield f"data: {json.dumps({'seq': cur, 'events': events, 'load': state.load()})}\n\n"
            last, quiet = cur, 0.0
        await asyncio.sleep(poll_s)
        quiet += poll_s


def default_model_name(model: Optional[str]) -> str:
    if model is None:
        from ..models.loader import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME
    base = os.path.basename(os.path.normpath(model))
    return base[:-5] if base.endswith(".gguf") else base
