"""Ray Serve: llmkern engines as the replicas of a Ray Serve application, behind an
OpenAI-compatible ingress (POST /v1/completions and /v1/chat/completions, streaming or not,
GET /v1/models, GET /health), autoscaled by Ray Serve and routed by llmkern's cache-aware cost.

Two deployments. `LLMServer`: each replica owns one engine, its EngineLoop and llmkern's own
FastAPI app (serve/app.py), and answers a request by running it through that app in-process
(ray_serve_asgi.py): the parsing, validation, errors and SSE are the ones `llmkern serve` has.
`OpenAIIngress`: the HTTP front; it tokenises the prompt once (for routing only; the replica
validates the request) and calls LLMServer through a handle whose request router
(ray_serve_router.py) ranks replicas by the prompt tokens each would have to compute. Every answer
carries `x-llmkern-replica` (the replica's id). Recipe (see docs/scale-out.md):

    from ray import serve
    from llmkern.integrations.ray_serve import build_app

    app = build_app(model=None, engine_kwargs={"kv_cache_memory_gb": 2},
                    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8})
    serve.run(app, route_prefix="/")   # OpenAI API on Ray Serve's HTTP port (8000 by default)
"""
from __future__ import annotations

import time
from typing import Optional

from .ray_serve_config import check_autoscaling

REPLICA_HEADER = "x-llmkern-replica"
_HOP_HEADERS = ("content-length", "transfer-encoding", "connection")   # the front sets its own


class LLMServer:
    """One llmkern engine per replica (the class Ray Serve deploys; usable without Ray in tests)."""

    def __init__(self, model: Optional[str] = None, engine_kwargs: Optional[dict] = None,
                 serve_kwargs: Optional[dict] = None, load_format: str = "auto"):
        from ..engine import LLM
        from ..serve.app import build_app as build_http_app, default_model_name
        from ..serve.config import ServeConfig
        from ..serve.engine_loop import EngineLoop

        self.engine = LLM(model, load_format=load_format, **dict(engine_kwargs or {})).engine
        cfg = ServeConfig(**dict(serve_kwargs or {}))
        self.loop = EngineLoop(self.engine)
        self.app = build_http_app(self.loop, cfg, cfg.served_model_name or default_model_name(model))
        state = self.app.state.llmkern
        self.state = state
        self.loop.on_finish, self.loop.on_abort = state.metrics.on_finish, state.metrics.on_abort
        self.loop.start()
        self.replica_id = _replica_id()

    async def handle(self, method: str, path: str, query: bytes, headers: list, body: bytes, route_ids=None):
        """The app's answer: {"status", "headers"} first, then the body's chunks. route_ids is the
        router's (ray_serve_router.py); the replica reads the request itself."""
        from .ray_serve_asgi import asgi_request

        async for item in asgi_request(self.app, method, path, query, headers, body):
            if isinstance(item, dict):
                item["headers"] = [(k, v) for k, v in item["headers"] if k.lower() not in _HOP_HEADERS]
                item["headers"].append((REPLICA_HEADER, self.replica_id))
            yield item

    def record_routing_stats(self) -> dict:
        """What the request router weighs (Ray Serve polls it): the prefix cache's block hashes and
        the load, as llmkern's GET /kv/snapshot reports them, and when they were taken."""
        return {"at": time.time(), "kv": self.state.kv_events.snapshot(), "load": self.state.load()}

    def check_health(self) -> None:
        if not self.loop.alive:     # Ray Serve replaces a replica whose health check raises
            raise RuntimeError(f"the engine loop is not running ({self.loop.error!r})")

    def __del__(self):
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a Ray Serve replica (a test building it directly)
        return "local"


def build_app(model: Optional[str] = None, engine_kwargs: Optional[dict] = None,
              autoscaling_config: Optional[dict] = None, num_replicas: Optional[int] = None,
              max_ongoing_requests: int = 16, replica_num_cpus: float = 1, serve_kwargs: Optional[dict] = None,
              router_kwargs: Optional[dict] = None, routing_stats_period_s: float = 0.5, load_format: str = "auto",
              name: str = "LLMServer"):
    """The Ray Serve application: `serve.run(build_app(...))`.

    engine_kwargs: LLM(...) keywords for every replica (kv_cache_memory_gb, max_num_seqs, ...);
    autoscaling_config: Ray Serve's (min_replicas, max_replicas, target_ongoing_requests,
    upscale_delay_s, downscale_delay_s, ...), or num_replicas for a fixed count;
    max_ongoing_requests: requests Ray sends one replica at once (more wait in the front);
    replica_num_cpus: Ray CPUs each engine reserves; serve_kwargs: ServeConfig fields of the
    replicas' app (served_model_name, max_n, ...); router_kwargs: CacheAware's prices."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ray_serve_ingress import OpenAIIngress
    from .ray_serve_router import CacheAwareRequestRouter

    autoscaling_config = check_autoscaling(autoscaling_config)
    if autoscaling_config is not None and num_replicas is not None:
        raise ValueError("num_replicas: give either num_replicas or autoscaling_config, not both")
    if num_replicas is not None and (isinstance(num_replicas, bool) or not isinstance(num_replicas, int)
                                     or num_replicas < 1):
        raise ValueError(f"num_replicas: expected an integer >= 1, got {num_replicas!r}")
    if not isinstance(max_ongoing_requests, int) or max_ongoing_requests < 1:
        raise ValueError(f"max_ongoing_requests: expected an integer >= 1, got {max_ongoing_requests!r}")
    for what, kw in (("engine_kwargs", engine_kwargs), ("serve_kwargs", serve_kwargs), ("router_kwargs", router_kwargs)):
        if kw is not None and not isinstance(kw, dict):
            raise ValueError(f"{what}: expected a dict of keyword arguments, got {type(kw).__name__}")
    router = RequestRouterConfig(request_router_class=CacheAwareRequestRouter,
                                 request_router_kwargs=dict(router_kwargs or {}),
                                 request_routing_stats_period_s=routing_stats_period_s)
    opts = dict(name=name, max_ongoing_requests=max_ongoing_requests, request_router_config=router,
                ray_actor_options={"num_cpus": replica_num_cpus}, health_check_period_s=1.0)
    if autoscaling_config is not None:
        opts["autoscaling_config"] = autoscaling_config
    else:
        opts["num_replicas"] = num_replicas or 1
    server = serve.deployment(LLMServer).options(**opts).bind(model, engine_kwargs, serve_kwargs, load_format)
    return OpenAIIngress.bind(server, model)


def app_builder(args: dict):
    """build_app for Ray Serve's config files and `serve run`: `import_path:
    llmkern.integrations.ray_serve:app_builder`, `args:` build_app's keywords."""
    import inspect

    known = set(inspect.signature(build_app).parameters)
    unknown = sorted(set(args or {}) - known)
    if unknown:
        raise ValueError(f"args.{unknown[0]}: not a build_app argument (known: {', '.join(sorted(known))})")
    return build_app(**dict(args or {}))
