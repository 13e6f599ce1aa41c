"""run_server: serve an Engine over HTTP with uvicorn until SIGTERM/SIGINT, then drain: stop
accepting (503), let in-flight requests finish for up to shutdown_grace_s, abort the rest with a
final error event, exit 0. A second signal exits at once.

If the engine dies (an error fault isolation could not pin on requests), its requests are
answered with a 500 engine_error, and the server exits with code 1 once they are sent (at most
DEATH_EXIT_S later), so that a supervisor can start a fresh one."""
from __future__ import annotations

import asyncio
import gc
import logging
import sys

import uvicorn

from .app import build_app
from .config import ServeConfig
from .engine_loop import EngineLoop

log = logging.getLogger("llmkern.serve")
DEATH_EXIT_S = 10.0   # after the engine died: how long the answers to its requests may take to send


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.state = state
        self._draining = False
        self._aio = None
        self.exit_code = 0

    async def serve(self, sockets=None):
        self._aio = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        # Not recorded as a captured signal: uvicorn would re-raise it after shutdown and the
        # process would end by the signal instead of exiting 0.
        if self._draining or self._aio is None:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self._aio.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        try:
            await self.state.drain(self.state.cfg.shutdown_grace_s)
        finally:
            self.should_exit = True

    def engine_died(self, e: BaseException) -> None:
        """EngineLoop.on_death (engine thread): exit non-zero once the answers are out."""
        self.exit_code = 1
        print(f"llmkern serve: the engine died ({type(e).__name__}); exiting with code 1", file=sys.stderr,
              flush=True)
        if self._aio is None:   # not serving yet
            self.should_exit = True
            return
        self._aio.call_soon_threadsafe(lambda: asyncio.ensure_future(self._exit_after_death()))

    async def _exit_after_death(self) -> None:
        self.state.draining = True   # ends the routers' /kv/events streams, which would hold the exit
        self.should_exit = True      # uvicorn stops accepting and lets the responses in progress finish
        await asyncio.sleep(DEATH_EXIT_S)
        self.force_exit = True


def freeze_gc_heap() -> None:
    """Hide every object alive at start-up from the cyclic garbage collector.

    A server holds ~220K long-lived tracked objects (model, tokenizer, the app). A full collection
    walks all of them while holding the GIL: 90-110 ms measured on a 2-core Xeon, and the first one
    came during the first burst of requests after start-up (whose survivors first crossed the
    collector's threshold), delaying every request in flight. Frozen objects are skipped by later
    collections (vLLM freezes its heap after start-up too). Unfreezing first lets objects frozen
    by an earlier call that have died since be collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def run_server(engine, cfg: ServeConfig, model_name: str, log_level: str = "warning") -> int:
    loop = EngineLoop(engine)
    app = build_app(loop, cfg, model_name)
    state = app.state.llmkern
    loop.on_finish = state.metrics.on_finish
    loop.on_abort = state.metrics.on_abort
    loop.start()
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING))
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            timeout_keep_alive=5, lifespan="off")
    server = _DrainingServer(config, state)
    loop.on_death = server.engine_died
    print(f"llmkern serve: '{model_name}' on http://{cfg.host}:{cfg.port}/v1 "
          f"(scheduler {engine.config.scheduler}, policy {engine.config.policy}"
          f"{', API key required' if cfg.api_key else ''})", file=sys.stderr, flush=True)
    if not loop.alive:   # died while the server was being set up
        server.engine_died(loop.error)
    freeze_gc_heap()
    try:
        server.run()
    finally:
        loop.stop()
        try:    # the engine's own resources: model-parallel workers, a KV connector's groups and files
            if not loop.alive and hasattr(engine, "shutdown"):   # never under a step still running
                engine.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway; say why the clean-up was cut short
            log.exception("llmkern: engine shutdown failed")
    return server.exit_code
