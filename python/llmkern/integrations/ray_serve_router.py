"""CacheAwareRequestRouter: a Ray Serve request router (the custom request router API) that ranks
the engine replicas with llmkern's own cache-aware cost (router/policies.py, CacheAware): the
prompt tokens a request would compute on a replica (counted from the replica's real block hashes),
the queue it would wait behind, its load and KV usage.

What the router knows of a replica comes from two places, as in llmkern's HTTP router:
- the replica's `record_routing_stats` (Ray polls it every request_routing_stats_period_s): its
  prefix cache's block hashes and its load, the same snapshot as `GET /kv/snapshot`;
- what this router sent there since: blocks about to be cached (ReplicaKV's pending blocks) and
  requests in flight. A finished request's blocks stay pending until a snapshot taken after it
  ended arrives, so a follow-up request sent at once still finds them.

The prompt's token ids come with the request (the ingress tokenises once, as llmkern's router does)
as the keyword argument `route_ids`; a request without them goes to the least loaded replica."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from ..router.core import Router
from ..router.kv_index import ReplicaKV
from ..router.policies import CacheAware, RouteRequest, worker_load

ROUTE_KWARG = "route_ids"


class ReplicaView:
    """One replica as llmkern's policy reads a worker: .url, .kv (ReplicaKV), .inflight, .requests."""

    def __init__(self, replica_id: str):
        self.url = replica_id
        self.kv = ReplicaKV()
        self.inflight = 0
        self.requests = 0
        self.stats_at = 0.0                          # when the replica took the last snapshot applied
        self.ended: List[Tuple[float, List[int]]] = []  # (end time, hashes) awaiting a later snapshot

    def refresh(self, stats: Optional[dict]) -> None:
        if not stats or "kv" not in stats or stats.get("at", 0.0) <= self.stats_at:
            return
        self.stats_at = stats["at"]
        self.kv.apply_snapshot(dict(stats["kv"], load=stats.get("load")))
        done = [h for t, hs in self.ended if t < self.stats_at for h in hs]
        self.ended = [(t, hs) for t, hs in self.ended if t >= self.stats_at]
        self.kv.settle(done)


class CacheAwareRequestRouter(RequestRouter):
    def initialize_state(self, **policy_args):
        """policy_args: CacheAware's prices (miss_price, evict_rounds, load_tokens, kv_tokens)."""
        self.policy = CacheAware(**policy_args)
        self.views: Dict[str, ReplicaView] = {}
        self.sent: Dict[str, Tuple[ReplicaView, RouteRequest]] = {}   # internal request id -> where

    def _view(self, r: RunningReplica) -> ReplicaView:
        rid = r.replica_id.unique_id
        v = self.views.get(rid)
        if v is None:
            v = self.views[rid] = ReplicaView(rid)
        v.refresh(r.routing_stats)
        return v

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for rid in set(self.views) - live:          # a replica scaled down or dead: forget its cache
            del self.views[rid]

    @staticmethod
    def _route_request(pending: Optional[PendingRequest]) -> RouteRequest:
        ids = (pending.kwargs or {}).get(ROUTE_KWARG) if pending is not None else None
        return RouteRequest(list(ids) if ids else [], "")

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        views = [self._view(r) for r in candidate_replicas]
        by_view = {id(v): r for v, r in zip(views, candidate_replicas)}
        req = self._route_request(pending_request)
        if req.token_ids:
            ranked = self.policy.rank(req, views)
        else:
            ranked = sorted(views, key=lambda v: (worker_load(v), v.inflight))
        if pending_request is not None:   # every replica is in the ranks: when all are full, wait before retrying
            pending_request.routing_context.should_backoff = True
        # One replica per rank: Ray tries the ranks in order and skips a replica whose queue is full.
        return [[by_view[id(v)]] for v in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        v = self.views.get(replica_id.unique_id)
        if v is None:
            return
        req = self._route_request(pending_request)
        Router.note_sent(v, req)
        self.sent[pending_request.metadata.internal_request_id] = (v, req)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        got = self.sent.pop(internal_request_id, None)
        if got is None:
            return
        v, req = got
        v.inflight -= 1
        if req.token_ids and v.kv.block_size:    # settled once a snapshot taken after now arrives
            v.ended.append((time.time(), req.hashes(v.kv.block_size)))
