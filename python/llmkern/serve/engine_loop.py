"""EngineLoop: one thread steps the engine; the asyncio side submits requests and reads each
request's outputs from its own queue.

The event loop never runs engine work: tokens reach a handler through call_soon_threadsafe, and
the kernels release the GIL while they run, so HTTP keeps being served during a step. Intake and
aborts are handed over under a lock and applied between steps, so a disconnect frees its KV blocks
within one step. Reused by anything that fronts an Engine (server, router replica, benchmarks).

A request the engine fails on its own (fault isolation) ends with finish_reason "error" like any
other output; an error that escapes Engine.step ends the loop: every request in flight or queued
gets a 500 `engine_error`, later ones a 503 `engine_dead`, and `on_death` is called (the server
exits then, so that a supervisor restarts it)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from .errors import APIError, from_value_error, request_error

log = logging.getLogger("llmkern.serve")


@dataclass
class _Submit:
    handle: "RequestHandle"
    prompt: list
    params: object
    kwargs: dict
    num_tokens: int


class RequestHandle:
    """What submit() returns: request_id and `queue`, which receives RequestOutputs (the last one
    has .finished) or a single APIError."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self._loop = loop

    def put(self, item) -> None:        # from the engine thread
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:             # the event loop is closed: nobody is listening
            pass


class EngineLoop:
    def __init__(self, engine, on_finish: Optional[Callable] = None):
        self.engine = engine
        self.on_finish = on_finish                  # called (engine thread) with each final output
        self.on_death: Optional[Callable[[BaseException], None]] = None   # (engine thread) when the loop dies
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._intake: List[_Submit] = []
        self._aborts: List[Tuple[str, Optional[APIError]]] = []
        self._abort_all: Optional[APIError] = None
        self._handles: Dict[str, RequestHandle] = {}   # engine thread only
        self._pending = [0, 0]                      # submitted, not yet in the engine: requests, tokens
        self._stats = engine.stats()
        self._ids = itertools.count()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None   # set when the loop died
        self.num_active = 0                          # requests submitted and not yet finished

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "EngineLoop":
        self._thread = threading.Thread(target=self._run, name="llmkern-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    # -- the asyncio side -------------------------------------------------------------------------
    def load(self):
        """(engine stats after the last step, requests and prompt tokens submitted but not yet
        handed to the engine), consistent with each other."""
        with self._lock:
            return self._stats, self._pending[0], self._pending[1]

    def submit(self, prompt_ids: List[int], params, *, stream: bool, priority: int = 0,
               queue_deadline: Optional[float] = None, arrival_time: Optional[float] = None,
               **engine_kwargs) -> RequestHandle:
        """engine_kwargs: more Engine.add_request arguments (e.g. a decode role's kv_transfer_params)."""
        if not self.alive:
            raise APIError(503, "the engine is not running", code="engine_dead")
        h = RequestHandle(f"r{next(self._ids)}", asyncio.get_running_loop())
        kw = dict(stream=stream, priority=priority, queue_deadline=queue_deadline,
                  arrival_time=arrival_time if arrival_time is not None else time.perf_counter(), **engine_kwargs)
        with self._lock:
            if self.error is not None:   # died since the check above: nobody would take it
                raise APIError(503, "the engine is not running", code="engine_dead")
            self._intake.append(_Submit(h, prompt_ids, params, kw, len(prompt_ids)))
            self._pending[0] += 1
            self._pending[1] += len(prompt_ids)
            self.num_active += 1
        self._wake.set()
        return h

    def abort(self, request_id: str, error: Optional[APIError] = None) -> None:
        """Abort a request (a client gone: no error; else the error its handle receives)."""
        with self._lock:
            self._aborts.append((request_id, error))
        self._wake.set()

    def abort_all(self, error: APIError) -> None:
        with self._lock:
            self._abort_all = error
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop:
                self._wake.clear()
                touched = self._apply_intake()
                if not eng.has_unfinished_requests():
                    if touched:
                        self._publish(eng.step())    # collects what aborts finished
                    self._wake.wait(0.5)
                    continue
                wait = eng.ready_in()
                if wait > 0:                         # a dynamic batch is forming
                    self._wake.wait(min(wait, 0.05))
                    self._apply_intake()
                self._publish(eng.step())
        except BaseException as e:  # noqa: B902 - whatever killed the loop is reported to every client
            self._die(e)

    def _die(self, e: BaseException) -> None:
        with self._lock:   # after this no submit() queues anything
            self.error = e
            intake, self._intake = self._intake, []
        handles = list(self._handles.values()) + [s.handle for s in intake]
        log.error("llmkern: the engine died (%s: %s); answering %d request(s) in flight with engine_error",
                  type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else "", len(handles),
                  exc_info=e)
        err = APIError(500, f"the engine failed: {type(e).__name__}", code="engine_error")
        for h in handles:
            h.put(err)
        self._handles.clear()
        with self._lock:
            self.num_active -= len(handles)
        if self.on_death is not None:
            try:
                self.on_death(e)
            except Exception:  # noqa: BLE001 - the loop is gone either way
                log.exception("llmkern: on_death failed")

    def _apply_intake(self) -> bool:
        eng = self.engine
        with self._lock:
            intake, self._intake = self._intake, []
            aborts, self._aborts = self._aborts, []
            abort_all, self._abort_all = self._abort_all, None
        done_tokens = 0
        for s in intake:
            done_tokens += s.num_tokens
            try:
                eng.add_request(s.prompt, s.params, request_id=s.handle.request_id, **s.kwargs)
                self._handles[s.handle.request_id] = s.handle
            except (ValueError, TypeError) as e:
                s.handle.put(from_value_error(e))
                self._done()
            except Exception as e:  # noqa: BLE001 - an input the checks missed fails its request only
                log.warning("llmkern: request %s failed on intake (%s: %s)", s.handle.request_id,
                            type(e).__name__, e, exc_info=e)
                eng.abort(s.handle.request_id)   # if it got in before the error
                s.handle.put(request_error(f"the request failed in the engine on intake: {type(e).__name__}"))
                self._done()
        if abort_all is not None:
            aborts += [(rid, abort_all) for rid in self._handles]
        for rid, err in aborts:
            h = self._handles.pop(rid, None)
            if h is None:
                continue
            eng.abort(rid)
            self._done()
            if err is not None:
                h.put(err)
        stats = eng.stats()
        with self._lock:
            self._stats = stats
            self._pending[0] -= len(intake)
            self._pending[1] -= done_tokens
        return bool(intake or aborts)

    def _done(self) -> None:
        with self._lock:
            self.num_active -= 1

    def _publish(self, outs) -> None:
        for out in outs:
            h = self._handles.get(out.request_id)
            if h is None:
                continue
            if out.finished:
                del self._handles[out.request_id]
                self._done()
                if self.on_finish is not None:
                    self.on_finish(out)
            h.put(out)
        stats = self.engine.stats()
        with self._lock:
            self._stats = stats
