"""OpenAIIngress: the Ray Serve HTTP front of build_app (ray_serve.py). It forwards each request to
an LLMServer replica through a streaming handle and relays the replica's answer (status, headers,
body; SSE chunk by chunk). The prompt is tokenised here, once, as llmkern's router does it, and
passed along for the request router only; the replica parses and validates the request itself.
Defined at module level: Ray pickles the class by reference (a class built in a function is
pickled with its FastAPI app, which recurses). No `from __future__ import annotations`: FastAPI
must see `Request` itself in the routes' signatures, not a string."""

import json
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError

from ..models.loader import load_tokenizer
from ..router.core import Router, replica_failed
from ..serve.errors import json_response
from .ray_serve_router import ROUTE_KWARG

_KINDS = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
app = FastAPI(title="llmkern on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="OpenAIIngress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
@serve.ingress(app)
class OpenAIIngress:
    def __init__(self, server, model: Optional[str] = None):
        self.server = server.options(stream=True)
        tok = load_tokenizer(model)      # the tokenizer only: this process runs no model
        self.router = Router([], tokenizer=tok)   # its route_request: the prompt as the router sees it

    def _route_ids(self, path: str, body: bytes):
        kind = _KINDS.get(path)
        if kind is None:
            return None
        try:
            obj = json.loads(body)
        except ValueError:
            return None              # the replica answers with the precise error
        return self.router.route_request(obj, kind).token_ids if isinstance(obj, dict) else None

    async def forward(self, request: Request):
        body = await request.body()
        path = request.url.path
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in ("host", "content-length")]
        headers.append(("content-length", str(len(body))))
        gen = self.server.handle.remote(request.method, path, request.url.query.encode(), headers, body,
                                        **{ROUTE_KWARG: self._route_ids(path, body)})
        try:
            head = await gen.__anext__()
            media = dict((k.lower(), v) for k, v in head["headers"]).get("content-type", "")
            if not media.startswith("text/event-stream"):
                chunks = [c async for c in gen]
                return Response(b"".join(chunks), status_code=head["status"], headers=dict(head["headers"]))
        except RayError as e:      # the replica died (or its actor failed) under the request
            return json_response(replica_failed(type(e).__name__))

        async def relay():
            try:
                async for chunk in gen:
                    yield chunk
            except RayError as e:  # as llmkern's router does: the error as the last event, then [DONE]
                err = replica_failed(f"{type(e).__name__} mid-stream; the output is incomplete")
                yield f"\n\ndata: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
            finally:
                gen.cancel()        # the client left mid-stream: the replica aborts the request

        return StreamingResponse(relay(), status_code=head["status"], headers=dict(head["headers"]))

    # One handler for every route: the replica's own app tells them apart.
    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    @app.get("/v1/models")
    @app.get("/health")
    async def route(self, request: Request):
        return await self.forward(request)
