"""The router's Prometheus text: per worker (label `worker`) requests sent, attempts that failed
before anything streamed (retried elsewhere), requests that failed mid-stream, health, requests in
flight, cached blocks known and KV resyncs; overall prompt tokens routed and those found cached in
the chosen worker at routing time. Under a launcher's supervisor, per replica: restarts, and exits
by cause (killed from outside, crashed)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_PER_WORKER = [
    ("llmkern_router_requests", "counter", "requests sent to the worker (attempts)", lambda w: w.requests),
    ("llmkern_router_retries", "counter", "attempts that failed before any byte was streamed; the request "
                                          "went to the next worker", lambda w: w.retried),
    ("llmkern_router_failures", "counter", "requests that failed after streaming began (the client got an "
                                           "error event)", lambda w: w.failed),
    ("llmkern_router_kv_resyncs", "counter", "snapshots taken again after a gap in the KV events",
     lambda w: w.kv.resyncs),
    ("llmkern_router_worker_healthy", "gauge", "1 while the worker passes health checks", lambda w: int(w.healthy)),
    ("llmkern_router_inflight", "gauge", "requests this router has in flight on the worker", lambda w: w.inflight),
    ("llmkern_router_cached_blocks", "gauge", "prefix-cache blocks the worker reported", lambda w: len(w.kv.hashes)),
]


class _Collector:
    def __init__(self, router):
        self.router = router

    def collect(self):
        workers = list(self.router.workers.values())
        for name, kind, doc, get in _PER_WORKER:
            fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=["worker"])
            for w in workers:
                fam.add_metric([w.url], get(w))
            yield fam
        r = self.router
        for name, doc, v in (("llmkern_router_prompt_tokens", "prompt tokens routed", r.routed_prompt_tokens),
                             ("llmkern_router_cached_prompt_tokens", "routed prompt tokens cached in the chosen "
                                                                     "worker at routing time", r.routed_cached_tokens),
                             ("llmkern_router_no_worker_errors", "requests refused: no healthy worker",
                              r.no_worker_errors)):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], v)
            yield fam
        pd = getattr(r, "pd_counters", None)      # the prefill-decode mode's paths
        for name, doc, v in (pd() if pd else []):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], v)
            yield fam
        sup = getattr(r, "supervisor", None)
        if sup is not None:
            fam = CounterMetricFamily("llmkern_router_replica_restarts", "times the launcher started the replica "
                                      "again after it exited", labels=["worker"])
            exits = CounterMetricFamily("llmkern_router_replica_exits", "replica process exits, by cause: killed "
                                        "(from outside) or crashed", labels=["worker", "cause"])
            for url, rep in sup.replicas.items():
                fam.add_metric([url], rep.restarts)
                for cause in ("killed", "crashed"):
                    exits.add_metric([url, cause], rep.exits.get(cause, 0))
            yield fam
            yield exits
        role_of = getattr(r, "role_of", None)
        if role_of is not None:
            fam = GaugeMetricFamily("llmkern_router_worker_role", "1 for the worker's role in --pd mode",
                                    labels=["worker", "role"])
            for w in workers:
                fam.add_metric([w.url, role_of(w.url)], 1)
            yield fam


def render_metrics(router) -> bytes:
    reg = CollectorRegistry()
    reg.register(_Collector(router))
    return generate_latest(reg)
