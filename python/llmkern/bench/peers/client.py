"""Bench side of the peer-driver protocol (driver_io.py): start a driver under a peer's python,
send it requests, read its replies with a deadline, and always reap it (its whole process group:
vLLM starts an engine-core child)."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from typing import Optional

from ...procs import child_setup, wait_idle

HERE = os.path.dirname(os.path.abspath(__file__))


class PeerError(RuntimeError):
    """The peer could not run (not installed, failed to start, failed a request, too slow)."""


def find_python(flag_value: Optional[str], env_var: str) -> tuple:
    """(path of the peer's python, None) or (None, why not): the flag wins over the variable."""
    path = flag_value or os.environ.get(env_var)
    if not path:
        return None, f"{env_var} is not set (the python of the peer's own venv; see bench/README.md)"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, f"{env_var}={path} is not an executable file"
    return path, None


class PeerProcess:
    """One driver process. Use as a context manager; close() reaps it even after a failure."""

    def __init__(self, python: str, driver: str, env: Optional[dict] = None, start_timeout: float = 900.0):
        self.start_timeout = start_timeout
        self.log = tempfile.TemporaryFile()  # the driver's stderr: kept for error messages
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        child_env.update(env or {})
        self.proc = subprocess.Popen([python, os.path.join(HERE, driver)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=child_env, cwd=HERE,
                                     start_new_session=True, preexec_fn=child_setup(None))  # dies with this process even if SIGKILLed
        self._buf = b""
        self._stuck = False  # a reply is overdue: the channel is out of step, close() kills at once

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def log_tail(self, n: int = 15) -> str:
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return "\n".join(lines[-n:])

    def _readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stuck = True
                    raise PeerError(f"no reply within {timeout:.0f} s")
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    rc = self.proc.wait(timeout=30)
                    raise PeerError(f"driver exited with status {rc}: {self.log_tail()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def request(self, msg: dict, timeout: float = 900.0) -> dict:
        """Send one request; its reply, or PeerError with the driver's error and log tail."""
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise PeerError(f"driver is gone ({e}): {self.log_tail()}") from None
        reply = json.loads(self._readline(timeout))
        if not reply.get("ok"):
            raise PeerError(reply.get("error") or "driver failed")
        return reply

    def init(self, model_dir: str, dtype: str, threads: int, **options) -> dict:
        return self.request({"op": "init", "model_dir": model_dir, "dtype": dtype, "threads": threads,
                             "options": options}, timeout=self.start_timeout)["info"]

    def generate(self, prompts, max_tokens, timeout: float = 900.0, fresh: bool = False) -> tuple:
        """(seconds, greedy output ids), each output checked to be exactly its max_tokens long.
        fresh: the peer's prefix cache is emptied first (untimed)."""
        r = self.request({"op": "generate", "prompts": [list(p) for p in prompts],
                          "max_tokens": list(max_tokens), "fresh": fresh}, timeout)
        ids = r["token_ids"]
        bad = [i for i, (s, n) in enumerate(zip(ids, max_tokens)) if len(s) != n]
        if len(ids) != len(prompts) or bad:
            raise PeerError(f"outputs do not have the requested lengths (requests {bad[:5]})")
        return float(r["seconds"]), ids

    def wait_idle(self, timeout_s: float = 10.0) -> float:
        """Waits until the driver and its children (vLLM's engine core) stop using the CPU, at most
        timeout_s; the seconds waited (procs.wait_idle)."""
        return wait_idle(self.proc.pid, timeout_s=timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None and not self._stuck:
            try:
                self.request({"op": "exit"}, timeout=30)
                self.proc.wait(timeout=30)
            except (PeerError, subprocess.TimeoutExpired, ValueError, OSError):
                pass
        try:  # the driver's children (vLLM's engine core) share its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.log.close()
