"""Run metrics: throughput, latency percentiles, prefix-cache hit rate, preemptions, offload."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional


def percentile(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class EngineStats:
    """Engine.stats(): load right now and counters since start."""
    num_running: int              # requests with a sequence running
    num_waiting: int              # requests with a sequence queued (not started or preempted)
    num_swapped: int              # sequences preempted to host memory
    prefill_tokens_pending: int   # prompt tokens still to compute, queued and running
    kv_blocks_total: int
    kv_blocks_free: int           # free blocks, cached prefix blocks included (evictable)
    num_preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prompt_tokens_computed: int
    generation_tokens: int
    prefill_tok_s: Optional[float]  # recent prefill rate (None before the first prefill)
    # prefill-decode hand-over (pd.interface.TransferStats): bytes, seconds and counts, both ways
    kv_bytes_sent: int = 0
    kv_bytes_received: int = 0
    kv_transfer_seconds_sent: float = 0.0
    kv_transfer_seconds_received: float = 0.0
    kv_transfers_done: int = 0
    kv_transfers_failed: int = 0
    kv_blocks_pinned: int = 0     # prefill: blocks held for hand-overs not finished yet
    num_waiting_for_kv: int = 0   # decode: requests whose KV is still arriving
    # disk KV tier (kvcache.disk_tier)
    kv_disk_hit_tokens: int = 0   # prompt tokens read back from disk instead of computed
    kv_disk_blocks_written: int = 0
    kv_disk_write_drops: int = 0  # blocks not written (the writer's queue was full, or the disk)
    kv_disk_bad_files: int = 0    # files that failed verification: deleted, never loaded

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.kv_blocks_free / self.kv_blocks_total if self.kv_blocks_total else 0.0


def inter_token_latencies(token_times: List[float]) -> List[float]:
    """One latency per output token after the first step's: a step that commits k tokens at once
    (accepted speculative tokens) spreads its gap over them, gap / k each, so the mean stays the
    time per output token and speculation never shows as 0 ms latencies."""
    groups: List[List[float]] = []  # [time, count] per step
    for t in token_times:
        if groups and groups[-1][0] == t:
            groups[-1][1] += 1
        else:
            groups.append([t, 1])
    out: List[float] = []
    for (t0, _), (t1, k) in zip(groups, groups[1:]):
        out += [(t1 - t0) / k] * int(k)
    return out


class RunMetrics:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.start: Optional[float] = None
        self.last: Optional[float] = None
        self.steps = 0
        self.model_time = 0.0
        self.prompt_tokens_computed = 0   # prefill rows run (cache hits excluded)
        self.generated_tokens = 0         # sampled tokens, all requests (finished or not)
        self.prefill_tok_s: Optional[float] = None  # moving average over prefill steps
        self.prompt_tokens = 0            # prompt tokens of finished requests
        self.output_tokens = 0
        self.requests_finished = 0
        self.ttfts: List[float] = []
        self.itls: List[float] = []
        self.e2es: List[float] = []

    def on_arrival(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def on_step(self, batch, num_sampled: int, dt: float) -> None:
        self.steps += 1
        self.model_time += dt
        n = sum(batch.prefill_lens)
        self.prompt_tokens_computed += n
        self.generated_tokens += num_sampled
        if n >= 16 and dt > 0:   # small chunks say more about per-step overhead than the rate
            r = n / dt
            self.prefill_tok_s = r if self.prefill_tok_s is None else 0.7 * self.prefill_tok_s + 0.3 * r
        self.last = time.perf_counter()

    def on_finish(self, m) -> None:
        self.requests_finished += 1
        self.prompt_tokens += m.num_prompt_tokens
        self.output_tokens += m.num_output_tokens
        if m.ttft is not None:
            self.ttfts.append(m.ttft)
        if m.e2e is not None:
            self.e2es.append(m.e2e)
        self.itls.extend(m.inter_token_latencies)

    def summary(self, cache_stats, num_preemptions: int) -> dict:
        elapsed = (self.last or time.perf_counter()) - (self.start or time.perf_counter())
        elapsed = max(elapsed, 1e-9)
        return {
            "requests": self.requests_finished,
            "elapsed_s": elapsed,
            "steps": self.steps,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "prompt_tok_s": self.prompt_tokens / elapsed,
            "output_tok_s": self.output_tokens / elapsed,
            "ttft_p50_s": percentile(self.ttfts, 50),
            "ttft_p99_s": percentile(self.ttfts, 99),
            "itl_p50_s": percentile(self.itls, 50),
            "itl_p99_s": percentile(self.itls, 99),
            "e2e_p50_s": percentile(self.e2es, 50),
            "prefix_cache_hit_rate": cache_stats.hit_rate,
            "prefix_hit_tokens": cache_stats.prefix_hit_tokens,
            "preemptions": num_preemptions,
            "blocks_offloaded": cache_stats.blocks_offloaded,
            "blocks_restored": cache_stats.blocks_restored,
            "blocks_swapped_out": cache_stats.blocks_swapped_out,
            "blocks_swapped_in": cache_stats.blocks_swapped_in,
        }


def format_summary(s: dict) -> str:
    def ms(x):
        return "-" if x is None else f"{1e3 * x:.1f} ms"

    spec = ""
    if s.get("speculative"):
        from .spec_decode import format_spec_summary

        spec = " | " + format_spec_summary(s["speculative"])
    return (f"{s['requests']} requests in {s['elapsed_s']:.2f} s | prompt {s['prompt_tok_s']:.1f} tok/s, "
            f"output {s['output_tok_s']:.1f} tok/s | TTFT p50 {ms(s['ttft_p50_s'])}, p99 {ms(s['ttft_p99_s'])} | "
            f"ITL p50 {ms(s['itl_p50_s'])} | prefix-cache hit rate {100 * s['prefix_cache_hit_rate']:.1f}% | "
            f"preemptions {s['preemptions']} | offload {s['blocks_offloaded']} out / {s['blocks_restored']} back, "
            f"swap {s['blocks_swapped_out']} out / {s['blocks_swapped_in']} in (blocks)" + spec)
