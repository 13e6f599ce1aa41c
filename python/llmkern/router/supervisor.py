"""ReplicaSupervisor: keeps a launcher's replicas running. A replica process that exits (its engine
died, it crashed, someone killed it) is taken out of the router at once and started again on the
same port after a bounded exponential back-off (1 s doubling to 30 s; back to 1 s once a replica
has stayed healthy for a minute). The router takes it back when its /health answers.

It also tells the router why a replica's connection broke (exit_cause): a replica killed from
outside (SIGKILL, SIGTERM, SIGINT, or drained to exit 0 by someone else's SIGTERM) did not fail
because of the request it was serving, so that request may be tried once elsewhere; any other
exit may have been caused by the request itself, which is then never retried (no retry storms).

It runs as a task on the router's event loop: the replicas are started from the main thread, which
their parent-death signal (procs.child_setup) is tied to."""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from ..procs import stop

log = logging.getLogger("llmkern.router")

KILLED, CRASHED = "killed", "crashed"
_OUTSIDE_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def exit_cause(returncode: int) -> str:
    """KILLED for an exit from outside (a signal someone sent, or 0 after draining on SIGTERM),
    CRASHED for any other (an engine that died exits non-zero; a fault signal such as SIGSEGV)."""
    if returncode == 0 or (returncode < 0 and -returncode in _OUTSIDE_SIGNALS):
        return KILLED
    return CRASHED


@dataclass
class Replica:
    url: str
    spawn: Callable[[], object]          # () -> a started Popen of this replica on its port
    proc: object = None
    restarts: int = 0
    backoff_s: float = 0.0
    restart_at: Optional[float] = None   # monotonic time of the next start, while it is down
    healthy_since: Optional[float] = None
    last_exit: Optional[tuple] = None    # (monotonic time, cause, returncode) of its last exit
    exits: Dict[str, int] = field(default_factory=dict)


class ReplicaSupervisor:
    def __init__(self, replicas: List[Replica], backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 reset_after_s: float = 60.0, poll_s: float = 0.1):
        self.replicas = {r.url: r for r in replicas}
        self.initial_backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.reset_after_s, self.poll_s = reset_after_s, poll_s
        for r in replicas:
            r.backoff_s = backoff_s
        self.router = None
        self.stopping = False
        self._task = None

    def procs(self) -> list:
        return [r.proc for r in self.replicas.values() if r.proc is not None]

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, router) -> None:
        """On the router's event loop (its app's start-up)."""
        self.router = router
        self._task = asyncio.ensure_future(self._run())

    async def stop_watching(self) -> None:
        """No more restarts (the launcher is shutting down)."""
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: B902 - cancelled: nothing to report
                pass
            self._task = None

    def stop_all(self, grace_s: float) -> None:
        """SIGTERM every replica (they drain), SIGKILL after grace_s."""
        self.stopping = True
        stop(self.procs(), grace_s)

    # -- what the router asks ---------------------------------------------------------------------
    async def exit_cause(self, url: str, wait_s: float = 2.0) -> Optional[str]:
        """Why the replica at url went away: KILLED, CRASHED, or None if it is still running after
        wait_s (a connection that broke for another reason) or is not supervised here."""
        r = self.replicas.get(url)
        if r is None:
            return None
        end = time.monotonic() + wait_s
        while True:
            if r.proc is not None and r.proc.poll() is not None:
                return exit_cause(r.proc.returncode)
            if r.last_exit is not None and time.monotonic() - r.last_exit[0] < wait_s + 5:
                return r.last_exit[1]          # already noted (and maybe restarted since)
            if time.monotonic() >= end:
                return None
            await asyncio.sleep(0.02)

    # -- the watch loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:             # until stop_watching cancels it; while stopping, exits are noted, not restarted
            now = time.monotonic()
            for r in self.replicas.values():
                self._tick(r, now)
            await asyncio.sleep(self.poll_s)

    def _worker(self, r: Replica):
        return (self.router.workers if self.router is not None else {}).get(r.url)

    def _tick(self, r: Replica, now: float) -> None:
        w = self._worker(r)
        if r.restart_at is None:
            if r.proc.poll() is None:
                if w is not None and w.healthy and r.healthy_since is None:
                    r.healthy_since = now
                return
            self._exited(r, w, now)
        elif now >= r.restart_at and not self.stopping:
            r.restart_at = None
            r.restarts += 1
            log.warning("llmkern: restarting replica %s (restart %d)", r.url, r.restarts)
            try:
                r.proc = r.spawn()
            except OSError as e:      # e.g. out of processes: tried again after the next back-off
                log.warning("llmkern: replica %s did not start (%s)", r.url, e)
                r.restart_at = now + r.backoff_s
                r.backoff_s = min(self.max_backoff_s, 2 * r.backoff_s)

    def _exited(self, r: Replica, w, now: float) -> None:
        code = r.proc.returncode
        cause = exit_cause(code)
        r.last_exit = (now, cause, code)
        r.exits[cause] = r.exits.get(cause, 0) + 1
        if w is not None:
            w.mark_down(f"replica process exited with {code}")
        if r.healthy_since is not None and now - r.healthy_since >= self.reset_after_s:
            r.backoff_s = self.initial_backoff_s
        r.healthy_since = None
        r.restart_at = now + r.backoff_s
        log.warning("llmkern: replica %s exited with %s (%s)%s", r.url, code,
                    "killed from outside" if cause == KILLED else "crashed",
                    "" if self.stopping else f"; restarting in {r.backoff_s:.0f} s")
        r.backoff_s = min(self.max_backoff_s, 2 * r.backoff_s)

    def info(self, url: str) -> dict:
        r = self.replicas.get(url)
        if r is None:
            return {}
        return {"pid": r.proc.pid if r.proc is not None and r.proc.poll() is None else None,
                "restarts": r.restarts, "exits": dict(r.exits)}
