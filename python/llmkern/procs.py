"""Child processes of launchers, benchmarks and the optimiser: free loopback ports, children that
die with their parent, health waits, stopping with a grace period, and the CPU time of a process
tree (a benchmark waits for a peer to go idle; the optimiser tells its own load from others').
One module, so every launcher reaps the same way."""
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


def _proc_table():
    """{pid: (ppid, utime+stime, cutime+cstime)} in clock ticks, of every process readable now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
        except OSError:   # exited meanwhile
            continue
        rest = s[s.rfind(")") + 2:].split()   # fields after "(comm)": state is rest[0]
        try:
            table[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))
        except (IndexError, ValueError):
            continue
    return table


def tree_cpu_ticks(root: int) -> int:
    """CPU time (clock ticks, os.sysconf("SC_CLK_TCK") a second) of root and its live descendants,
    plus what root's reaped children used (the kernel adds a waited-for child's time to its
    parent's cutime). Linux only: 0 where /proc is missing."""
    try:
        table = _proc_table()
    except OSError:
        return 0
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    total, stack, seen = table.get(root, (0, 0, 0))[2], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        stack += kids.get(pid, [])
    return total


def wait_idle(root: int, window_s: float = 0.2, busy_share: float = 0.1, timeout_s: float = 10.0) -> float:
    """Waits until root's process tree used under busy_share of one CPU over a window_s window
    (at most timeout_s); returns the seconds waited. For alternating benchmarks: vLLM's CPU engine
    keeps polling a core for about a second after each request batch, which would otherwise land
    on whatever runs next."""
    if not os.path.isdir("/proc"):
        return 0.0
    hz, t0 = os.sysconf("SC_CLK_TCK"), time.monotonic()
    before = tree_cpu_ticks(root)
    while time.monotonic() - t0 < timeout_s:
        time.sleep(window_s)
        now = tree_cpu_ticks(root)
        if (now - before) / hz < busy_share * window_s:
            break
        before = now
    return time.monotonic() - t0


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
