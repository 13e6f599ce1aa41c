"""`llmkern serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one Engine.

Pieces, each reusable by later fronts (a router, disaggregated prefill/decode):
  EngineLoop (engine_loop.py)  steps the engine on its own thread; per-request output queues
  build_app (app.py)           the FastAPI app over an EngineLoop and a ServeConfig
  run_server (server.py)       loads the engine, serves it, drains on SIGTERM/SIGINT
Needs the `serve` extra: pip install 'llmkern[serve]'."""
from __future__ import annotations

from .config import ServeConfig

__all__ = ["ServeConfig", "build_app", "EngineLoop", "run_server"]


def __getattr__(name):  # fastapi/uvicorn are imported only when the server is used
    if name == "build_app":
        from .app import build_app

        return build_app
    if name == "EngineLoop":
        from .engine_loop import EngineLoop

        return EngineLoop
    if name == "run_server":
        from .server import run_server

        return run_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
