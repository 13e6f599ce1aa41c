"""Routing policies. Each ranks the healthy workers for one request; the router sends it to the
first and, if that one fails before streaming anything, to the next.

cache_aware (default) scores every worker by the work a request would wait behind there plus the
work it brings, now and later, in prompt tokens (one unit for every term, so the weights are
prices, not knobs):

    cost = queued_prefill_tokens + price * (new_tokens + EVICT_ROUNDS * evicted_tokens)
           + LOAD_TOKENS * load + KV_TOKENS * kv_usage              (score = -cost; lowest wins)
    price = MISS_PRICE + arrival_rate * new_tokens / prefill_rate

queued_prefill_tokens: prompt tokens the worker still has to compute (its report, every 0.25 s,
plus what this router sent since; the replica counts a waiting request without the prefix it will
find cached); new_tokens: the request's prompt tokens the worker does not hold in its prefix cache
and is not about to (blocks routed there whose events have not arrived yet), counted exactly from
the worker's own chained block hashes; evicted_tokens: how much of the worker's live working set
(the blocks its last LIVE_REQUESTS requests from this router asked for, kv_index.py) the new
blocks would push out of a cache of kv_blocks_total blocks: 0 while they fit; load: requests on
the worker (the larger of this router's in-flight count and the worker's waiting + running, so
other routers' traffic counts too), each priced at LOAD_TOKENS (64): its decode steps share the
worker; kv_usage: the fraction of KV blocks in use (near 1 means preemption is close), priced at
KV_TOKENS (256) when full.

The price of a computed token is a lasting cost, not only the request's own wait. MISS_PRICE (4):
the request waits for its tokens, so does every request queued behind it, and a replica that
spends its time on copies has less for its own tenants (prices 1 and 2 spread the tenants: a
spill made a miss, the miss made a queue, the queue made more spills). The second term is what
makes it hold under overload: while the new tokens are computed, arrival_rate (requests/s this
router sent over the last RATE_S) * new_tokens / prefill_rate (tokens/s, the fastest any replica
measured) more requests arrive, and in a throughput-bound cluster every one of them waits for that
work wherever it runs: moving a request to a shorter queue then adds a copy instead of removing
work. EVICT_ROUNDS (8): an evicted live block is recomputed by the next request of the prefix it
belonged to, and, with a cache smaller than its working set, again on every round of the replica's
LRU (the tail-first eviction rolls from prefix to prefix). Measured with `llmkern bench router
--simulate --sim-slowdown 1..4 --rate 0.25..2` (the default workload, 3 seeds, both variants, 32
cells): with a flat price of 4 per computed and 4 per evicted token, cache_aware was 3.4 hit-rate
points behind approx_tree on average and 16.7 at 1 request/s on 4x slower replicas (every queue
long: it moved tenants whose queue was a few prompts longer, and each copy evicted another
tenant); with these prices 0.6 on average and at most 3.3 (the worst cells are the most
overloaded: 2 requests/s on 3-4x slower replicas). EVICT_ROUNDS from 2 to 16 measured alike once
the rate term is there (0.56..0.61 points); without it (the previous 8-tenant workload) a flat 16
per evicted token still lost 0.9. A live set counted in seconds (30 s) instead of requests missed
tenants that come back less often than that (low rates, long queues) and piled new prefixes onto
one replica.

A cached 700-token prompt is thus worth ~2.8k tokens of queue on a quiet cluster (7 s of prefill on
one CPU thread) and more as the arrival rate approaches what the replicas can compute: a tenant's
requests stay where their prefix is until that worker's queue is longer by more than that, then go
where they wait less (a hot tenant spreads); a new prefix goes where it evicts nothing that is
still asked for. No on/off threshold."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List

from .approx_tree import ApproxTree
from .kv_index import request_hashes

POLICIES = ("cache_aware", "approx_tree", "least_load", "round_robin", "prefix_only")


@dataclass
class RouteRequest:
    token_ids: List[int]
    text: str                                    # what approx_tree matches (prompt or rendered chat)
    _hashes: Dict[int, List[int]] = field(default_factory=dict)

    def hashes(self, block_size: int) -> List[int]:
        if block_size not in self._hashes:
            self._hashes[block_size] = request_hashes(self.token_ids, block_size)
        return self._hashes[block_size]

    def cached_fraction(self, worker) -> float:
        kv = worker.kv
        if not kv.synced or not self.token_ids:
            return 0.0
        return kv.matched_blocks(self.hashes(kv.block_size)) * kv.block_size / len(self.token_ids)


def worker_load(w) -> int:
    rep = w.kv.load
    return max(w.inflight, int(rep.get("num_waiting", 0)) + int(rep.get("num_running", 0)))


def evicted_tokens(req: RouteRequest, w, new_tokens: float) -> float:
    """Tokens of w's live working set that new_tokens more would push out of its cache (0 when
    the worker does not report its size)."""
    kv = w.kv
    total = int(kv.load.get("kv_blocks_total") or 0)
    if not total or not kv.synced or new_tokens <= 0:
        return 0.0
    new_blocks = new_tokens / kv.block_size
    over = kv.live_blocks(req.hashes(kv.block_size)) + new_blocks - total
    return max(0.0, min(new_blocks, over)) * kv.block_size


def _by_load(workers):
    return sorted(workers, key=lambda w: (worker_load(w), w.inflight))


class RoundRobin:
    name = "round_robin"

    def __init__(self):
        self._n = itertools.count()

    def rank(self, req: RouteRequest, workers: list) -> list:
        k = next(self._n) % len(workers)
        return workers[k:] + workers[:k]


class LeastLoad:
    name = "least_load"

    def rank(self, req, workers):
        return _by_load(workers)


def arrival_rate(workers) -> float:
    """Requests per second this router sent to any of the workers lately."""
    return sum(w.kv.sent_per_s() for w in workers)


def prefill_rate(workers) -> float:
    """The fastest prefill rate (tokens/s) any worker measured, 0 before one has: the replicas run
    one model, and a replica whose last prefills were short measured its step overhead more than
    its rate (one figure for all keeps a prefix cached nowhere an even choice)."""
    return max((float(w.kv.load.get("prefill_tok_s") or 0.0) for w in workers), default=0.0)


def miss_price(base: float, new_tokens: float, tok_s: float, rate: float) -> float:
    """Price of one prompt token computed on a worker prefilling tok_s tokens/s: base, plus the
    requests that arrive while it computes the new tokens (rate * new_tokens / tok_s): work added
    to a throughput-bound cluster delays every one of them."""
    return base + (rate * new_tokens / tok_s if tok_s > 0 else 0.0)


@dataclass
class CacheAware:
    miss_price: float = 4.0
    evict_rounds: float = 8.0
    load_tokens: float = 64.0
    kv_tokens: float = 256.0
    name: str = "cache_aware"

    def costs(self, req: RouteRequest, workers: list) -> List[float]:
        n = len(req.token_ids)
        rate, tok_s = arrival_rate(workers), prefill_rate(workers)
        out = []
        for w in workers:
            new = (1.0 - req.cached_fraction(w)) * n
            price = miss_price(self.miss_price, new, tok_s, rate)
            out.append(w.kv.queued_prefill_tokens() + price * (new + self.evict_rounds * evicted_tokens(req, w, new))
                       + self.load_tokens * worker_load(w) + self.kv_tokens * float(w.kv.load.get("kv_usage", 0.0)))
        return out

    def scores(self, req: RouteRequest, workers: list) -> List[float]:
        return [-c for c in self.costs(req, workers)]

    def rank(self, req, workers):
        # Ties (a prefix cached nowhere, equal queues) go to the worker holding the fewest blocks:
        # new prefixes spread over the workers instead of piling onto the first one.
        s = self.scores(req, workers)
        order = sorted(range(len(workers)), key=lambda i: (-s[i], worker_load(workers[i]),
                                                           len(workers[i].kv.hashes) + len(workers[i].kv.pending), i))
        return [workers[i] for i in order]


class PrefixOnly:
    """The oracle of the benchmark: the longest cached prefix, ties to the least loaded."""
    name = "prefix_only"

    def rank(self, req, workers):
        return sorted(workers, key=lambda w: (-req.cached_fraction(w), worker_load(w)))


@dataclass
class ApproxTreePolicy:
    """SGLang's cache-aware router as published: if the load is imbalanced (max - min above
    balance_abs_threshold and max above balance_rel_threshold * min) the least loaded worker;
    else the worker whose tree matches the most text if the match rate exceeds cache_threshold,
    else the worker with the smallest tree. The request's text is then inserted into the tree of
    the chosen worker."""
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001
    max_tree_chars: int = 1 << 20
    name: str = "approx_tree"
    trees: Dict[str, ApproxTree] = field(default_factory=dict)

    def _tree(self, w) -> ApproxTree:
        t = self.trees.get(w.url)
        if t is None:
            t = self.trees[w.url] = ApproxTree(self.max_tree_chars)
        return t

    def rank(self, req, workers):
        loads = [worker_load(w) for w in workers]
        hi, lo = max(loads), min(loads)
        rest = _by_load(workers)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            chosen = rest[0]
        else:
            matches = [self._tree(w).match(req.text) for w in workers]
            best = max(range(len(workers)), key=lambda i: (matches[i], -loads[i]))
            if req.text and matches[best] / len(req.text) > self.cache_threshold:
                chosen = workers[best]
            else:
                chosen = min(workers, key=lambda w: self._tree(w).size)
        self._tree(chosen).insert(req.text)
        return [chosen] + [w for w in rest if w is not chosen]

    def forget(self, url: str) -> None:
        self.trees.pop(url, None)


def make_policy(name: str, **kw):
    table = {"cache_aware": CacheAware, "approx_tree": ApproxTreePolicy, "least_load": LeastLoad,
             "round_robin": RoundRobin, "prefix_only": PrefixOnly}
    if name not in table:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")
    return table[name](**kw)
