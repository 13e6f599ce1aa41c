"""Chaos run (`llmkern bench chaos`): does a data-parallel cluster lose requests when a replica is
killed and poison requests arrive?

Starts `llmkern serve --data-parallel-size 2` with LLMKERN_FAULT_INJECT=sample:POISON (or uses a
running launcher, --url), sends a steady load of --num-requests completions (--concurrency at a
time, every other one streamed) with the word POISON in every --poison-every-th prompt, and
SIGKILLs one replica (the one with the most requests in flight) when --kill-at of them have been
sent. Each request ends completed, failed with a clean error (an OpenAI error object: a poison
request's 500 `request_error`, a stream cut by the kill's `replica_failed`), or lost (a hang, a
broken connection, an answer that is not the API's). Reports the counts, the error codes, the
restarts the launcher made, and the seconds from the kill until the replica was healthy again;
exits non-zero if a request was lost or the replica did not come back within --recover-timeout."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import List, Optional

from ..loadgen.outcome import COMPLETED, FAILED, LOST, Outcome, send_checked


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight at a time (a steady load)")
    p.add_argument("--poison-every", type=int, default=20, help="every N-th request is a poison request (0: none)")
    p.add_argument("--poison-word", default="POISON", help="what the fault injection matches in the prompt")
    p.add_argument("--kill-at", type=int, default=None, help="SIGKILL a replica once this many requests were sent "
                                                             "(default: a third of them)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--url", default=None, help="a running `serve --data-parallel-size` launcher on this machine "
                                               "instead of starting one (its fault injection is its own)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="a request unanswered by then is lost")
    p.add_argument("--recover-timeout", type=float, default=60.0,
                   help="the killed replica must be healthy again within this many seconds")
    p.add_argument("--json", default=None, help="also write the report to this file")


def _get(base: str, path: str):
    import httpx

    return httpx.get(base + path, timeout=10)


def workers(base: str) -> dict:
    return {w["url"]: w for w in _get(base, "/admin/workers").json()["workers"]}


def restarts(base: str) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    return int(sum(s.value for fam in text_string_to_metric_families(_get(base, "/metrics").text)
                   for s in fam.samples if s.name == "llmkern_router_replica_restarts_total"))


def _body(i: int, a) -> dict:
    poison = a.poison_every and i % a.poison_every == a.poison_every // 2
    prompt = f"Request {i}: " + (f"{a.poison_word} " if poison else "") + "tell me a short story about a lighthouse."
    return {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "stream": i % 2 == 1}


class _Killer:
    """SIGKILLs the replica with the most requests in flight, then times its way back to healthy."""

    def __init__(self, base: str):
        self.base = base
        self.url: Optional[str] = None
        self.killed_at: Optional[float] = None
        self.recovered_s: Optional[float] = None

    def kill(self) -> None:
        ws = workers(self.base)
        live = [w for w in ws.values() if w.get("pid")]
        if not live:
            raise RuntimeError("chaos: the launcher reports no replica pid (is --url a `serve "
                               "--data-parallel-size` launcher?)")
        victim = max(live, key=lambda w: w["inflight"])
        self.url, self.pid = victim["url"], victim["pid"]
        self.killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        print(f"[chaos] SIGKILL replica {self.url} (pid {victim['pid']}, {victim['inflight']} in flight)",
              file=sys.stderr, flush=True)

    async def watch(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        end = self.killed_at + timeout
        while time.monotonic() < end:
            w = (await loop.run_in_executor(None, workers, self.base)).get(self.url, {})
            if w.get("healthy") and w.get("pid") not in (None, self.pid):
                self.recovered_s = round(time.monotonic() - self.killed_at, 2)
                return
            await asyncio.sleep(0.2)


async def drive(base: str, a) -> tuple:
    """(outcomes in request order, poison indices, the killer)."""
    import httpx

    kill_at = a.num_requests // 3 if a.kill_at is None else a.kill_at
    killer = _Killer(base)
    outcomes: List[Optional[Outcome]] = [None] * a.num_requests
    poison = [i for i in range(a.num_requests) if a.poison_word in _body(i, a)["prompt"]]
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(a.num_requests):
        queue.put_nowait(i)
    watch = None
    limits = httpx.Limits(max_connections=a.concurrency + 4)
    async with httpx.AsyncClient(timeout=a.request_timeout, limits=limits) as client:
        async def worker():
            nonlocal watch
            while not queue.empty():
                i = queue.get_nowait()
                if i == kill_at and watch is None:
                    await asyncio.get_running_loop().run_in_executor(None, killer.kill)
                    watch = asyncio.ensure_future(killer.watch(a.recover_timeout))
                outcomes[i] = await send_checked(client, base + "/v1/completions", _body(i, a), a.request_timeout)
        await asyncio.gather(*[worker() for _ in range(a.concurrency)])
        if watch is not None:
            await watch
    return outcomes, poison, killer


def report(outcomes: List[Outcome], poison: List[int], killer: _Killer, restarts_seen: int) -> dict:
    kinds = Counter(o.kind for o in outcomes)
    return {"requests": len(outcomes), "completed": kinds[COMPLETED], "failed_clean": kinds[FAILED],
            "lost": kinds[LOST], "error_codes": dict(Counter(o.code for o in outcomes if o.kind == FAILED)),
            "poison_sent": len(poison), "poison_failed_clean": sum(outcomes[i].kind == FAILED for i in poison),
            "killed_replica": killer.url, "restarts_seen": restarts_seen,
            "recovered_after_s": killer.recovered_s,
            "lost_detail": [o.detail for o in outcomes if o.kind == LOST][:10]}


def run_against(base: str, a) -> dict:
    before = restarts(base)
    outcomes, poison, killer = asyncio.run(drive(base, a))
    return report(outcomes, poison, killer, restarts(base) - before)


def _launch(a):
    from ..procs import ServerProcess, llmkern_serve_argv, wait_healthy

    env = dict(os.environ)
    env.setdefault("LLMKERN_FAULT_INJECT", f"sample:{a.poison_word}")
    argv = llmkern_serve_argv(["--data-parallel-size", "2", "--max-model-len", str(a.max_model_len)], a.model)
    srv = ServerProcess("serve --data-parallel-size 2", argv, env=env)
    try:
        end = time.monotonic() + 300
        while sum(w["healthy"] for w in workers(srv.base).values()) < 2:
            if time.monotonic() > end:
                raise RuntimeError("chaos: the two replicas did not both become healthy")
            wait_healthy(srv.base + "/health", 10, srv.proc, srv.name)
            time.sleep(0.2)
    except BaseException:
        srv.close()
        raise
    return srv


def main(a) -> int:
    srv = None if a.url else _launch(a)
    try:
        rep = run_against(a.url or srv.base, a)
    finally:
        if srv is not None:
            srv.close()
    print(json.dumps(rep, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)
    if rep["poison_failed_clean"] < rep["poison_sent"]:
        print(f"chaos: note: {rep['poison_sent'] - rep['poison_failed_clean']} poison request(s) did not fail: is "
              "LLMKERN_FAULT_INJECT active in the replicas' engine?", file=sys.stderr)
    problems = []
    if rep["lost"]:
        problems.append(f"{rep['lost']} request(s) lost")
    if rep["recovered_after_s"] is None:
        problems.append(f"the killed replica was not healthy again within {a.recover_timeout} s")
    if problems:
        print("chaos: FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"chaos: ok: {rep['completed']} completed, {rep['failed_clean']} failed with a clean error, 0 lost; "
          f"replica back after {rep['recovered_after_s']} s", file=sys.stderr)
    return 0
