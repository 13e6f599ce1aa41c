"""/metrics in Prometheus text format. Names mirror vLLM's `vllm:*` family with an `llmkern:`
prefix (dashboards port by a prefix swap); every series carries the model_name label.

Per-request histograms and counters are updated when a request finishes; load gauges and the
engine's own counters (prefix cache, preemptions) are read from the engine's latest stats at
scrape time."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

P = "llmkern:"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


class _EngineCollector:
    def __init__(self, loop, model: str):
        self.loop, self.model = loop, model

    def collect(self):
        st, pending_req, _ = self.loop.load()
        m = [self.model]

        def family(cls, name, doc, value):
            f = cls(P + name, doc, labels=["model_name"])
            f.add_metric(m, value)
            return f

        yield family(GaugeMetricFamily, "num_requests_running", "Requests running in the engine.", st.num_running)
        yield family(GaugeMetricFamily, "num_requests_waiting", "Requests waiting to start (or preempted).",
                     st.num_waiting + pending_req)
        yield family(GaugeMetricFamily, "num_requests_swapped", "Sequences swapped to host memory.", st.num_swapped)
        yield family(GaugeMetricFamily, "kv_cache_usage_perc", "KV-cache block usage (1 = full).", st.kv_usage)
        yield family(CounterMetricFamily, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                     st.prefix_query_tokens)
        yield family(CounterMetricFamily, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                     st.prefix_hit_tokens)
        yield family(CounterMetricFamily, "num_preemptions", "Preemptions of running sequences.", st.num_preemptions)
        yield from _kv_transfer_families(st, self.model)


def _kv_transfer_families(st, model: str):
    """Prefill-decode hand-overs (serve --role prefill|decode): KV bytes and seconds by direction,
    completed and failed transfers, blocks pinned for sends, requests waiting for their KV."""
    for name, doc, sent, recv in (
            ("kv_transfer_bytes", "KV-cache bytes handed over, by direction.", "kv_bytes_sent", "kv_bytes_received"),
            ("kv_transfer_seconds", "Wall time of KV hand-overs, by direction.", "kv_transfer_seconds_sent",
             "kv_transfer_seconds_received")):
        f = CounterMetricFamily(P + name, doc, labels=["model_name", "direction"])
        f.add_metric([model, "sent"], getattr(st, sent, 0))
        f.add_metric([model, "received"], getattr(st, recv, 0))
        yield f
    for cls, name, doc, attr in (
            (CounterMetricFamily, "kv_transfers", "KV hand-overs completed (both directions).", "kv_transfers_done"),
            (CounterMetricFamily, "kv_transfers_failed", "KV hand-overs that failed (deadline, peer gone, bad data).",
             "kv_transfers_failed"),
            (GaugeMetricFamily, "kv_blocks_pinned", "Blocks a prefill engine holds for hand-overs in progress.",
             "kv_blocks_pinned"),
            (GaugeMetricFamily, "num_requests_waiting_for_kv", "Requests on a decode engine whose KV is arriving.",
             "num_waiting_for_kv")):
        f = cls(P + name, doc, labels=["model_name"])
        f.add_metric([model], getattr(st, attr, 0))
        yield f


class ServeMetrics:
    def __init__(self, loop, model: str):
        self.model = model
        self.registry = r = CollectorRegistry()
        lab = ["model_name"]
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token.", lab,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between output tokens.", lab,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to finish.", lab,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(P + "request_queue_time_seconds", "Arrival to first scheduled.", lab,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests.", lab, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens of finished requests.", lab,
                                         registry=r)
        self.success = Counter(P + "request_success", "Finished requests by finish reason.",
                               lab + ["finished_reason"], registry=r)
        self.rejected = Counter(P + "request_rejected", "Requests refused or failed before starting, by reason.",
                                lab + ["reason"], registry=r)
        r.register(_EngineCollector(loop, model))

    def on_finish(self, out) -> None:
        """A request's final output (engine thread; prometheus_client is thread-safe)."""
        m, lab = out.metrics, self.model
        if out.finish_reason == "timeout":
            self.rejected.labels(lab, "queue_timeout").inc()
            return
        if m is not None:
            if m.ttft is not None:
                self.ttft.labels(lab).observe(m.ttft)
            if m.e2e is not None:
                self.e2e.labels(lab).observe(m.e2e)
            if m.queue_time is not None:
                self.queue.labels(lab).observe(m.queue_time)
            h = self.itl.labels(lab)
            for x in m.inter_token_latencies:
                h.observe(x)
            self.prompt_tokens.labels(lab).inc(m.num_prompt_tokens)
            self.generation_tokens.labels(lab).inc(m.num_output_tokens)
        for c in out.outputs:
            self.success.labels(lab, c.finish_reason or "unknown").inc()

    def on_abort(self, n: int = 1) -> None:
        """Requests ended before finishing (client gone, server draining): vLLM's
        request_success_total{finished_reason="abort"}."""
        if n:
            self.success.labels(self.model, "abort").inc(n)

    def on_reject(self, reason: str) -> None:
        self.rejected.labels(self.model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
