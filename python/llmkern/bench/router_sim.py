"""Router simulator (`llmkern bench router --simulate`): the router benchmark's workload and the
real policy classes, against a discrete-event model of the replicas, so that a policy change is
judged in seconds instead of a ten-minute run.

What is real: the workload generator (bench/routing.py), the tokenizer, the chained block hashes
(engine.block_pool), the policies and the router's bookkeeping (Router.rank / note_sent, ReplicaKV
fed by event messages and load reports, as the replicas' streams feed it). What is modelled: each
replica is an engine with continuous batching (decodes first, then chunked prefills in arrival
order under max_num_batched_tokens), a KV pool of a fixed number of blocks with prefix caching and
LRU eviction of unused cached blocks (a request holds all its blocks from admission to finish;
one that does not fit waits), and a step time of

    step_s + prefill_tok_s * prompt tokens computed + decode_seq_s * decoding sequences.

Those three costs are measured (`--calibrate`: an engine in this process, on --threads-per-replica
threads, wall time: on a busy machine they come out slower, as the real replicas run) or taken
from the defaults below (the default SmolLM2-135M GGUF on one thread, CPU time of the same
measurement on a 2-core x86 machine, i.e. what a quiet machine would give). Replicas publish their block events EVENT_DELAY_S after the step that caused them and
their load every REPORT_S, like the real event stream."""
from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..engine.block_pool import chain_block_hashes
from ..router.core import Router
from ..router.kv_index import ReplicaKV
from ..router.policies import RouteRequest, make_policy

EVENT_DELAY_S = 0.02   # a step's block events reach the router (SSE over loopback)
REPORT_S = 0.25        # load reports (the event stream's heartbeat)
NET_S = 0.003          # router <-> replica, each way


@dataclass
class Costs:
    step_s: float = 0.023          # fixed cost of one engine step
    prefill_tok_s: float = 0.0027  # per prompt token computed
    decode_seq_s: float = 0.0011   # per sequence decoding in the step

    def slowed(self, factor: float) -> "Costs":
        """Every cost times factor: replicas on a busy machine (or a bigger model) at the same
        arrival rate, i.e. a cluster closer to or past its throughput."""
        if not factor > 0:
            raise ValueError(f"sim_slowdown: expected a factor > 0, got {factor}")
        return Costs(self.step_s * factor, self.prefill_tok_s * factor, self.decode_seq_s * factor)

    def __str__(self) -> str:
        return (f"step {self.step_s * 1e3:.1f} ms + {self.prefill_tok_s * 1e6:.0f} us/prompt token "
                f"+ {self.decode_seq_s * 1e3:.1f} ms/decoding sequence")


class _Req:
    __slots__ = ("rid", "tokens", "hashes", "arrival", "max_tokens", "computed", "generated", "shared",
                 "private", "ttft", "hit_tokens")

    def __init__(self, rid, tokens, hashes, arrival, max_tokens):
        self.rid, self.tokens, self.hashes, self.arrival, self.max_tokens = rid, tokens, hashes, arrival, max_tokens
        self.computed = 0      # prompt tokens with KV (cached or computed)
        self.generated = 0
        self.shared: List[int] = []   # cached block hashes this request holds a reference on
        self.private = 0       # blocks it holds that are not (yet) in the prefix cache
        self.ttft: Optional[float] = None
        self.hit_tokens = 0


class SimReplica:
    """One engine: the KV pool (cached blocks by hash with reference counts, the unused ones in LRU
    order), the queue and the running batch."""

    def __init__(self, num_blocks: int, block_size: int, costs: Costs, max_batched_tokens: int = 2048):
        self.num_blocks, self.bs, self.costs, self.budget = num_blocks, block_size, costs, max_batched_tokens
        self.refs: Dict[int, int] = {}                  # cached block hash -> references
        self.lru: "OrderedDict[int, None]" = OrderedDict()  # cached blocks with no reference
        self.private = 0
        self.waiting: deque = deque()
        self.running: List[_Req] = []
        self.busy = False
        self.seq = 0
        self.events: List[tuple] = []
        self.queries = self.hits = 0
        self.prefill_tok_s = None     # measured like the engine's: a moving average over prefill steps

    # -- the pool --------------------------------------------------------------------------------
    def _event(self, kind: str, h: int) -> None:
        self.seq += 1
        self.events.append((self.seq, kind, h))

    def _cached_prefix(self, r: _Req) -> int:
        """Prompt tokens a waiting request would find cached now (what the engine reports as not
        pending)."""
        n = 0
        while n < len(r.hashes) and r.hashes[n] in self.refs:
            n += 1
        return n * self.bs

    def _admit(self, r: _Req) -> bool:
        n = 0
        while n < len(r.hashes) and r.hashes[n] in self.refs:
            n += 1
        need = -(-(len(r.tokens) + r.max_tokens) // self.bs) - n
        in_use = len(self.refs) - len(self.lru) + self.private
        reusable = sum(1 for h in r.hashes[:n] if h in self.lru)
        if in_use + reusable + need > self.num_blocks:
            return False
        for h in r.hashes[:n]:
            self.refs[h] += 1
            self.lru.pop(h, None)
        r.shared = list(r.hashes[:n])
        while len(self.refs) + self.private + need > self.num_blocks:
            h, _ = self.lru.popitem(last=False)
            del self.refs[h]
            self._event("removed", h)
        self.private += need
        r.private = need
        r.computed = r.hit_tokens = n * self.bs
        self.queries += len(r.tokens)
        self.hits += r.hit_tokens
        return True

    def _register(self, r: _Req, upto_tokens: int) -> None:
        """Full prompt blocks computed up to upto_tokens enter the prefix cache (unless an equal
        block got there first: then this request's copy stays private, as in the engine)."""
        for i in range(len(r.shared), min(upto_tokens // self.bs, len(r.hashes))):
            h = r.hashes[i]
            if h in self.refs:
                break
            self.refs[h] = 1
            r.shared.append(h)
            r.private -= 1
            self.private -= 1
            self._event("stored", h)

    def _release(self, r: _Req) -> None:
        for h in reversed(r.shared):        # the tail first: it is evicted before the head (as in the engine)
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.lru[h] = None
        self.private -= r.private

    # -- steps -----------------------------------------------------------------------------------
    def load(self) -> dict:
        pend = (sum(len(r.tokens) - r.computed for r in self.running if r.computed < len(r.tokens))
                + sum(len(r.tokens) - self._cached_prefix(r) for r in self.waiting))
        in_use = len(self.refs) - len(self.lru) + self.private
        return {"num_waiting": len(self.waiting), "num_running": len(self.running),
                "prefill_tokens_pending": pend, "kv_usage": in_use / self.num_blocks, "kv_blocks_total": self.num_blocks,
                "prefill_tok_s": self.prefill_tok_s}

    def start_step(self):
        """The step's plan and duration, or None when there is nothing to do."""
        decodes = [r for r in self.running if r.computed >= len(r.tokens)]
        budget = self.budget - len(decodes)
        chunks = []
        for r in self.running:
            if r.computed < len(r.tokens) and budget > 0:
                c = min(len(r.tokens) - r.computed, budget)
                chunks.append((r, c))
                budget -= c
        while self.waiting and budget > 0 and self._admit(self.waiting[0]):
            r = self.waiting.popleft()
            self.running.append(r)
            c = min(len(r.tokens) - r.computed, budget)
            chunks.append((r, c))
            budget -= c
        if not decodes and not chunks:
            return None
        ntok = sum(c for _, c in chunks)
        dt = self.costs.step_s + self.costs.prefill_tok_s * ntok + self.costs.decode_seq_s * len(decodes)
        return (decodes, chunks), dt

    def end_step(self, plan, now: float) -> List[_Req]:
        """Apply the step; the requests that finished."""
        decodes, chunks = plan
        done = []
        n = sum(c for _, c in chunks)
        if n >= 16:
            dt = self.costs.step_s + self.costs.prefill_tok_s * n + self.costs.decode_seq_s * len(decodes)
            rate = n / dt
            self.prefill_tok_s = rate if self.prefill_tok_s is None else 0.7 * self.prefill_tok_s + 0.3 * rate
        for r, c in chunks:
            r.computed += c
            self._register(r, r.computed)
            if r.computed >= len(r.tokens):
                r.ttft = now - r.arrival + NET_S
                r.generated = 1
        for r in decodes:
            r.generated += 1
        for r in [r for r in self.running if r.computed >= len(r.tokens) and r.generated >= r.max_tokens]:
            self.running.remove(r)
            self._release(r)
            done.append(r)
        return done


class _SimWorker:
    """What the router sees of a replica (the shape of router.worker.Worker)."""

    def __init__(self, url: str, clock):
        self.url = url
        self.kv = ReplicaKV()
        self.kv.clock = clock
        self.healthy = True
        self.inflight = self.requests = self.retried = self.failed = 0


def simulate(policy: str, reqs, num_replicas: int, num_blocks: int, costs: Costs, block_size: int = 16,
             max_tokens: int = 8) -> dict:
    """reqs: [(arrival_s, prompt text, token_ids)]. The same report fields as the real benchmark."""
    need = max((-(-(len(toks) + max_tokens) // block_size) for _, _, toks in reqs), default=0)
    if need > num_blocks:
        raise ValueError(f"num_blocks: {num_blocks} KV blocks cannot hold a request of {need} blocks")
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    router = Router([], policy=policy)
    reps = [SimReplica(num_blocks, block_size, costs) for _ in range(num_replicas)]
    workers = []
    for i in range(num_replicas):
        w = _SimWorker(f"sim://{i}", clock)
        w.kv.apply_snapshot({"seq": 0, "block_size": block_size, "hashes": [], "load": reps[i].load()})
        router.workers[w.url] = w
        workers.append(w)
    q: list = []
    tie = itertools.count()

    def at(t, kind, *args):
        heapq.heappush(q, (t, next(tie), kind, args))

    all_reqs = []
    routed = {}                 # request id -> its RouteRequest
    for i, (t, text, toks) in enumerate(reqs):
        at(t, "arrive", i, text, toks)
    for i in range(num_replicas):
        at(REPORT_S, "report", i)
    pending = len(reqs)

    def kick(i):
        rep = reps[i]
        if rep.busy:
            return
        s = rep.start_step()
        if s is not None:
            rep.busy = True
            at(now[0] + s[1], "step", i, s[0])

    while q and pending:
        now[0], _, kind, args = heapq.heappop(q)
        if kind == "arrive":
            rid, text, toks = args
            rr = RouteRequest(list(toks), text)
            w = router.rank(rr)[0]
            router.note_sent(w, rr)
            i = workers.index(w)
            r = _Req(rid, rr.token_ids, chain_block_hashes(rr.token_ids[:-1], block_size), now[0], max_tokens)
            all_reqs.append((r, i))
            routed[rid] = rr
            at(now[0] + NET_S, "deliver", i, r)
        elif kind == "deliver":
            i, r = args
            reps[i].waiting.append(r)
            kick(i)
        elif kind == "step":
            i, plan = args
            rep = reps[i]
            rep.busy = False
            for r in rep.end_step(plan, now[0]):
                at(now[0] + NET_S, "done", i, r)
            if rep.events:
                at(now[0] + EVENT_DELAY_S, "kv", i, {"events": rep.events})
                rep.events = []
            kick(i)
        elif kind == "done":
            i, r = args
            router.note_done(workers[i], routed[r.rid])
            pending -= 1
        elif kind == "kv":
            workers[args[0]].kv.apply_message(args[1])
        elif kind == "report":
            i = args[0]
            at(now[0] + EVENT_DELAY_S, "kv", i, {"events": [], "load": reps[i].load()})
            at(now[0] + REPORT_S, "report", i)
    ttfts = sorted(r.ttft for r, _ in all_reqs)
    counts = [w.requests for w in workers]
    qs, hs = sum(r.queries for r in reps), sum(r.hits for r in reps)
    wall = max(now[0], 1e-9)
    return {"policy": policy, "hit_rate": hs / qs if qs else 0.0, "ttft_p50_s": _pct(ttfts, 0.5),
            "ttft_p99_s": _pct(ttfts, 0.99), "req_per_s": len(all_reqs) / wall,
            "output_tok_per_s": len(all_reqs) * max_tokens / wall, "requests_per_replica": counts,
            "imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else None,
            "retries": 0, "failures": 0,
            "per_request": [(r.rid, i, r.hit_tokens, round(r.ttft, 3)) for r, i in sorted(all_reqs, key=lambda x: x[0].rid)]}


def _pct(xs, q):
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def calibrate(model: Optional[str], threads: int = 1, prompt_tokens: int = 1024) -> Costs:
    """Step costs measured on an engine in this process: a long prefill, and decode steps of 1 and
    of 4 sequences (three equations, three unknowns)."""
    import torch

    from ..engine.engine import Engine
    from ..engine.config import EngineConfig
    from ..engine.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    eng = Engine(model, EngineConfig(device="cpu", enable_prefix_caching=False, kv_cache_memory_gb=0.5))
    try:
        def timed_steps(prompts, max_tokens):
            for p in prompts:
                eng.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
            times = []
            while eng.has_unfinished_requests():
                t = time.perf_counter()
                eng.step()
                times.append(time.perf_counter() - t)
            return times

        timed_steps([[1] * 32], 4)                               # warm up
        pre = timed_steps([list(range(100, 100 + prompt_tokens))], 1)[0]
        d1 = timed_steps([[2] * 16], 12)[2:]
        d4 = timed_steps([[3 + k] * 16 for k in range(4)], 12)[2:]
    finally:
        eng.shutdown()
    t1, t4 = sorted(d1)[len(d1) // 2], sorted(d4)[len(d4) // 2]
    seq = max((t4 - t1) / 3, 0.0)
    step = max(t1 - seq, 0.0)
    return Costs(step_s=step, prefill_tok_s=max(pre - step, 0.0) / prompt_tokens, decode_seq_s=seq)
