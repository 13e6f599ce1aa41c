"""Prefill-decode disaggregation benchmark (`llmkern bench pd`, bench/bench_pd.py).

One workload, two systems, the same requests: steady chat decoding (short prompts, Poisson
arrivals, fixed output lengths) plus bursts of long prompts at fixed times (several at once, a few
output tokens each). Systems: co-located (`llmkern serve`, one engine on --threads CPUs) and
disaggregated (`llmkern serve --pd 1P1D`: a prefill and a decode engine on --threads / 2 CPUs
each, the router in front). Both run on the same CPUs of this machine.

Per system: TTFT p50/p99 (chat requests, long requests), ITL p50/p99 of the chat requests over
the whole run and during bursts (from a burst's arrival until its last long prompt has its first
token: while its prefills run), output tok/s, and for the disaggregated system the KV bytes moved
and transfer time per request (from the replicas' /metrics). The point of disaggregation is the
ITL during bursts; the ratio co-located / disaggregated is printed (target >= 2)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from typing import Dict, List, Optional

from ..engine.metrics import percentile
from ..loadgen import Req, drive, words_text
from ..procs import ServerProcess, llmkern_serve_argv


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--threads", type=int, default=2, help="CPUs for the co-located engine (PD: half each)")
    p.add_argument("--chat-requests", type=int, default=12)
    p.add_argument("--chat-rate", type=float, default=0.8, help="chat arrivals per second (Poisson)")
    p.add_argument("--chat-max-tokens", type=int, default=40, help="output tokens per chat request")
    p.add_argument("--bursts", type=int, default=2, help="bursts of long prompts, evenly spread over the run")
    p.add_argument("--burst-size", type=int, default=2, help="long prompts per burst (arriving together)")
    p.add_argument("--long-words", type=int, default=500, help="words per long prompt (~1.2 tokens each)")
    p.add_argument("--long-max-tokens", type=int, default=8)
    p.add_argument("--kv-connector", default="torch", help="the PD replicas' KV connector")
    p.add_argument("--systems", nargs="+", default=["colocated", "pd"], choices=["colocated", "pd"])
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report as JSON here")


def workload(a) -> List[Req]:
    """Chat requests (Poisson) and bursts of long prompts, sorted by arrival; same for each seed."""
    rng = random.Random(a.seed)
    reqs, t = [], 0.0
    fixed = {"ignore_eos": True}
    for _ in range(a.chat_requests):
        t += rng.expovariate(a.chat_rate)
        text = words_text(rng, rng.randint(20, 60))
        reqs.append(Req(t, "Continue this story: " + text, a.chat_max_tokens, dict(fixed)))
    span = t
    for b in range(a.bursts):
        at = span * (b + 1) / (a.bursts + 1)
        for _ in range(a.burst_size):
            text = words_text(rng, a.long_words)
            reqs.append(Req(at, "Summarise this in one sentence: " + text, a.long_max_tokens,
                            dict(fixed, user="burst")))
    return sorted(reqs, key=lambda r: r.arrival)


def _p(xs, q) -> Optional[float]:
    v = percentile(xs, q)
    return None if v is None else round(v, 4)


def summarise(system: str, reqs: List[Req], results, wall: float) -> dict:
    chat = [(q, r) for q, r in zip(reqs, results) if q.extra.get("user") != "burst"]
    long_ = [(q, r) for q, r in zip(reqs, results) if q.extra.get("user") == "burst"]
    # Each burst's window: its arrival (first token time - TTFT) until its last first token.
    bursts: Dict[float, List[float]] = {}
    for q, r in long_:
        if r.ok and r.times:
            start = r.times[0] - r.ttft
            lo, hi = bursts.setdefault(q.arrival, [start, r.times[0]])
            bursts[q.arrival] = [min(lo, start), max(hi, r.times[0])]
    windows = list(bursts.values())
    itl_all, itl_burst = [], []
    for _, r in chat:
        for a, b in zip(r.times, r.times[1:]):
            itl_all.append(b - a)
            if any(lo <= b <= hi for lo, hi in windows):
                itl_burst.append(b - a)
    ok = [r for _, r in chat + long_ if r.ok]
    return {"system": system, "requests": len(results), "completed": len(ok),
            "ttft_chat_p50": _p([r.ttft for _, r in chat if r.ok], 50),
            "ttft_chat_p99": _p([r.ttft for _, r in chat if r.ok], 99),
            "ttft_long_p50": _p([r.ttft for _, r in long_ if r.ok], 50),
            "ttft_long_p99": _p([r.ttft for _, r in long_ if r.ok], 99),
            "itl_p50": _p(itl_all, 50), "itl_p99": _p(itl_all, 99),
            "itl_burst_p50": _p(itl_burst, 50), "itl_burst_p99": _p(itl_burst, 99),
            "itl_burst_samples": len(itl_burst),
            "out_tok_s": round(sum(r.tokens for r in ok) / wall, 2), "wall_s": round(wall, 2)}


def _metric_sums(url: str, names) -> Dict[str, float]:
    import httpx

    out = {n: 0.0 for n in names}
    for line in httpx.get(url + "/metrics", timeout=120).text.splitlines():   # a busy 1-CPU replica is slow
        for n in names:
            if line.startswith(n + "{") or line.startswith(n + " "):
                out[n] += float(line.split()[-1])
    return out


_KV = ("llmkern:kv_transfer_bytes_total", "llmkern:kv_transfer_seconds_total", "llmkern:kv_transfers_total")


def _env(cpus: List[int]) -> dict:
    from ..cpu_affinity import format_cpus

    return dict(os.environ, LLMKERN_CPUS=format_cpus(cpus), OMP_NUM_THREADS=str(len(cpus)))


def run_system(system: str, a, reqs: List[Req], model_name: str) -> dict:
    import httpx

    from ..cpu_affinity import allowed_cpus

    cpus = allowed_cpus()[:a.threads]
    extra = ["--kv-cache-memory-gb", "1", "--max-num-seqs", "64"]
    if system == "pd":
        extra += ["--pd", "1P1D", "--kv-connector", a.kv_connector]
    srv = ServerProcess(system, llmkern_serve_argv(extra, a.model), env=_env(cpus))
    try:
        replicas = []
        if system == "pd":
            replicas = [w["url"] for w in httpx.get(srv.base + "/admin/workers", timeout=60).json()["workers"]]
        asyncio.run(drive(srv.base, model_name, [Req(0.0, "Hello", 4)], a.timeout))   # warm-up
        before = [_metric_sums(u, _KV) for u in replicas]
        results, wall = asyncio.run(drive(srv.base, model_name, reqs, a.timeout))
        row = summarise(system, reqs, results, wall)
        if replicas:
            after = [_metric_sums(u, _KV) for u in replicas]
            d = {n: sum(x[n] - y[n] for x, y in zip(after, before)) for n in _KV}
            # Both ends count a transfer; the decode side's figures are the ones reported.
            n = max(1.0, d[_KV[2]] / 2 if d[_KV[2]] else 1.0)
            row["kv_bytes_per_request"] = round(d[_KV[0]] / 2 / n) if d[_KV[0]] else None
            row["kv_transfer_ms_per_request"] = round(1e3 * d[_KV[1]] / 2 / n, 2) if d[_KV[1]] else None
            row["kv_transfers"] = int(d[_KV[2]] / 2)
        return row
    finally:
        srv.close()


def table(rows: List[dict]) -> str:
    cols = ["system", "completed", "ttft_chat_p50", "ttft_chat_p99", "ttft_long_p50", "ttft_long_p99", "itl_p50",
            "itl_p99", "itl_burst_p50", "itl_burst_p99", "out_tok_s", "kv_bytes_per_request",
            "kv_transfer_ms_per_request"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def run_bench(a) -> dict:
    from ..models.loader import DEFAULT_MODEL_NAME

    if a.threads < 2:
        raise SystemExit("llmkern bench pd: --threads: expected at least 2 (the PD replicas get half each)")
    model_name = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))
    reqs = workload(a)
    rows = []
    for system in a.systems:
        row = run_system(system, a, reqs, model_name)
        rows.append(row)
        print(f"[pd] {system}: {json.dumps(row)}", file=sys.stderr, flush=True)
    args = {k: v for k, v in vars(a).items() if not callable(v)}
    report = {"args": args, "cpus": os.cpu_count(), "rows": rows}
    by = {r["system"]: r for r in rows}
    if "colocated" in by and "pd" in by:
        c, d = by["colocated"], by["pd"]

        def ratio(k):
            return round(c[k] / d[k], 2) if c.get(k) and d.get(k) else None

        report["ratios_colocated_over_pd"] = {k: ratio(k) for k in ("itl_burst_p99", "itl_p99", "ttft_chat_p99",
                                                                    "ttft_long_p99")}
        report["throughput_pd_over_colocated"] = round(d["out_tok_s"] / c["out_tok_s"], 3) if c["out_tok_s"] else None
    text = table(rows) + "\n\n" + "\n".join(f"{k}: {v}" for k, v in report.items()
                                            if k.startswith(("ratios", "throughput"))) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="llmkern bench pd", description=__doc__.split("\n")[0])
    add_args(ap)
    run_bench(ap.parse_args(argv))
    return 0
