"""Child processes of launchers, benchmarks and the optimiser: free loopback ports, children that
die with their parent, health waits, and stopping with a grace period. One module, so every
launcher reaps the same way."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterable, List, Optional

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port free on the loopback address now (the child binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_setup(cpus: Optional[List[int]] = None):
    """A Popen preexec_fn: the child dies with this process even if it is SIGKILLed, and runs on
    `cpus` when given."""
    def setup():
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
    return setup


def stop(procs: Iterable[subprocess.Popen], grace_s: float = 15.0) -> None:
    """SIGTERM every process still running, wait up to grace_s for each, then SIGKILL."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def wait_healthy(url: str, timeout: float, proc: Optional[subprocess.Popen] = None, what: str = "server") -> None:
    """Poll GET url until it answers 200; RuntimeError if proc exits first or timeout passes."""
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not ready after {timeout} s")


class ServerProcess:
    """A server subprocess on a free loopback port ("{port}" in argv is replaced), ready when its
    health URL answers; its output kept for error messages; stopped on close."""

    def __init__(self, name: str, argv: List[str], health: str = "/health", timeout: float = 300, env=None):
        self.name = name
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env or os.environ.copy(),
                                     preexec_fn=child_setup(None))
        try:
            wait_healthy(self.base + health, timeout, self.proc, name)
        except RuntimeError as e:
            tail = self.tail()
            self.close()
            raise RuntimeError(f"{e}: {tail}") from None
        except BaseException:   # Ctrl-C while waiting: the caller never gets the object to close
            self.close()
            raise

    def tail(self, n: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read()[-n:]

    def close(self) -> None:
        stop([self.proc], 15)
        self.log.close()


def llmkern_serve_argv(extra: List[str], model: Optional[str]) -> List[str]:
    """`llmkern serve` on the ServerProcess's port, with no drain on stop."""
    return ([sys.executable, "-m", "llmkern.cli", "serve", "--port", "{port}", "--shutdown-grace-s", "0"]
            + (["--model", model] if model else []) + extra)
