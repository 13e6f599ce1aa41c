"""Workloads of `llmkern optimize`: the named built-ins and JSONL files of requests.

A workload is a seeded list of requests (prompt text, output length, arrival offset). Serving
workloads are sent as chat completions by the open-loop client (Poisson arrivals at `rate`,
rescaled by a request_rate knob); `offline` runs in-process, every request at time 0."""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field, replace
from typing import List, Optional

from ..loadgen import Req, chat_mix as _chat_mix, words_text as _words

BUILTINS = ("chat", "long-prompt", "shared-prefix", "offline")


@dataclass
class Workload:
    name: str
    kind: str                      # 'serve' | 'offline'
    requests: List[Req]
    rate: Optional[float]          # req/s of the arrivals as built (None: all at once)
    spec: dict = field(default_factory=dict)
    prefix_words: int = 0          # shared-prefix: words of the common system prompt

    def with_rate(self, rate: Optional[float]) -> "Workload":
        """The same requests with arrivals rescaled to `rate` req/s (None: unchanged)."""
        if rate is None or rate == self.rate:
            return self
        if not self.rate:
            raise ValueError(f"request_rate: workload {self.name!r} has no arrival times to rescale")
        k = self.rate / rate
        return replace(self, requests=[replace(r, arrival=r.arrival * k) for r in self.requests], rate=rate)


def _poisson(rng: random.Random, n: int, rate: float) -> List[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def builtin(name: str, num_requests: Optional[int] = None, rate: Optional[float] = None, seed: int = 0) -> Workload:
    """chat: short turns (20-100 words, 16-64 output tokens), 2 req/s; long-prompt: 300-500-word
    documents to summarise (16-32 output tokens), 0.5 req/s; shared-prefix: one 300-word system
    prompt + a short question (16-48 output tokens), 2 req/s; offline: 32 chat-like prompts at once."""
    rng = random.Random(seed)
    if name == "chat":
        n, r = num_requests or 24, rate or 2.0
        reqs = _chat_mix(n, r, seed, long_frac=0.0)
        return Workload(name, "serve", reqs, r, {"builtin": name, "n": n, "rate": r, "seed": seed})
    if name == "long-prompt":
        n, r = num_requests or 12, rate or 0.5
        reqs = _chat_mix(n, r, seed, long_frac=1.0)
        return Workload(name, "serve", reqs, r, {"builtin": name, "n": n, "rate": r, "seed": seed})
    if name == "shared-prefix":
        n, r = num_requests or 24, rate or 2.0
        system = "You are a helpful assistant. Background: " + _words(random.Random(seed + 7919), 300) + ". Question: "
        reqs = [Req(t, system + _words(rng, rng.randint(10, 30)), rng.randint(16, 48)) for t in _poisson(rng, n, r)]
        return Workload(name, "serve", reqs, r, {"builtin": name, "n": n, "rate": r, "seed": seed},
                        prefix_words=len(system.split()))
    if name == "offline":
        n = num_requests or 32
        reqs = [Req(0.0, "Continue this story: " + _words(rng, rng.randint(20, 100)), rng.randint(16, 64))
                for _ in range(n)]
        return Workload(name, "offline", reqs, None, {"builtin": name, "n": n, "seed": seed})
    raise ValueError(f"--workload: unknown workload {name!r} (expected one of {', '.join(BUILTINS)} or a .jsonl file)")


def from_jsonl(path: str, rate: Optional[float] = None, seed: int = 0, offline: bool = False) -> Workload:
    """One request per line: {"prompt": str, "max_tokens": int, ["arrival": seconds]}. Without
    arrivals, Poisson at `rate` (default 1 req/s); offline: all at once."""
    if not os.path.isfile(path):
        raise ValueError(f"--workload: {path!r} is neither a built-in workload nor an existing .jsonl file")
    reqs, arrivals = [], []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--workload {path}: line {i}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
                raise ValueError(f"--workload {path}: line {i}: expected an object with a non-empty \"prompt\" string")
            mt = obj.get("max_tokens", 64)
            if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
                raise ValueError(f"--workload {path}: line {i}: \"max_tokens\" must be an integer >= 1, got {mt!r}")
            arr = obj.get("arrival")
            if arr is not None and (not isinstance(arr, (int, float)) or isinstance(arr, bool) or arr < 0):
                raise ValueError(f"--workload {path}: line {i}: \"arrival\" must be seconds >= 0, got {arr!r}")
            arrivals.append(arr)
            reqs.append(Req(0.0, obj["prompt"], mt))
    if not reqs:
        raise ValueError(f"--workload {path}: no requests")
    name = os.path.basename(path)
    spec = {"jsonl": name, "n": len(reqs), "seed": seed}
    if offline:
        return Workload(name, "offline", reqs, None, spec)
    if all(a is not None for a in arrivals):
        span = max(arrivals) or 1.0
        reqs = [replace(r, arrival=float(a)) for r, a in zip(reqs, arrivals)]
        return Workload(name, "serve", reqs, len(reqs) / span, dict(spec, arrivals="file")).with_rate(rate)
    r = rate or 1.0
    times = _poisson(random.Random(seed), len(reqs), r)
    return Workload(name, "serve", [replace(q, arrival=t) for q, t in zip(reqs, times)], r, dict(spec, rate=r))


def load(name: str, num_requests: Optional[int] = None, rate: Optional[float] = None, seed: int = 0,
         offline: bool = False) -> Workload:
    if name.endswith(".jsonl") or os.path.sep in name:
        return from_jsonl(name, rate, seed, offline)
    return builtin(name, num_requests, rate, seed)
