"""Router benchmark (`llmkern bench router`, bench/bench_router.py): N replicas behind the router,
a multi-tenant workload (each tenant its own long system prompt, short user turns), Poisson
arrivals; the same requests and seed for every policy, fresh replicas (empty caches) per policy.
Variants: `uniform` (tenants equally likely) and `skewed` (one hot tenant: --skew of the requests
go to it, the rest are spread over all the tenants, so it sends --skew + (1 - --skew) / --tenants
of them: 50.5% by default, nine times any other tenant).

The regime is the one where routing matters: the tenants' prefixes together do not fit one
replica's KV cache, but do fit the replicas' caches together. Each replica gets exactly
--kv-blocks-per-replica KV blocks; by default room for KV_FIT (50%) of the tenants' prompts: with
10 tenants and 2 replicas a partition of the tenants fits, a copy of every tenant on every replica
(least_load, round_robin) evicts prefixes it will need again. 60 requests let a tenant come back
about six times. `--tenants 4` with a large --kv-blocks-per-replica is the easy case (every
replica holds every prefix: all policies hit alike).

What the skewed variant can show. With a hot share s every policy keeps the hot tenant cached
(it comes back too often to be evicted) and every policy misses each cold tenant's first
request, so the hit-rate ratio of a cache-aware policy to least_load is at most about
1 / s_hot (s_hot = the hot tenant's share of the requests, 0.505: about 2) and reaches that only
if least_load never hits a cold tenant; an LRU cache of room C holding N cold tenants hits about
C / N of their returns even when the traffic is spread blindly. Measured with --simulate (6
seeds, 10 tenants, 60 requests; hit rate over least_load's, cache_aware / the oracle):

    --skew 0.7  (hot share 0.73)               1.09 / 1.09
    --skew 0.55 (0.60)                         1.23 / 1.18
    --skew 0.45 (0.505, the default)           1.36 / 1.31   TTFT p99 0.70x least_load's
    --skew 0.4  (0.46)                         1.42 / 1.39
    --skew 0.4, KV_FIT 0.4 (a tighter cache)   1.50 / 1.47

Issue 19's 1.5 needs a hot tenant sending less than half of the requests and a cache tighter
than the uniform variant's; the default keeps "one tenant sends most of the traffic" and
reports the oracle's ratio beside cache_aware's. The variant still tests what the issue means:
least_load thrashes the cold tenants, a cache-aware policy partitions them and spreads the hot
one (TTFT p50 8x better than round_robin's, p99 below least_load's).

Per policy: prefix-cache hit rate (prompt tokens, from the replicas' own counters), TTFT p50/p99
(client side, first streamed token), throughput, per-replica share of requests. `prefix_only`
always picks the replica with the longest cached prefix: the oracle hit rate.

`--simulate` runs the same workload and the same policy code against a model of the replicas
(bench/router_sim.py) in seconds; `--calibrate` measures that model's step costs first,
`--sim-slowdown F` multiplies them (an overloaded cluster: a busy machine, a bigger model)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import List

from ..procs import child_setup, free_port, wait_healthy

KV_FIT = 0.5          # share of the tenants' prompts one replica's cache holds
KV_RUNNING = 4        # and at least this many whole requests
POLICIES = ["round_robin", "least_load", "approx_tree", "cache_aware", "prefix_only"]
WORDS = ("system user policy answer invoice refund order account billing shipment delay customer "
         "product support ticket priority escalate summary polite brief cite reference manual").split()


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--tenants", type=int, default=10)
    p.add_argument("--system-words", type=int, default=700, help="words per system prompt (~1 token each)")
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals per second")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--skew", type=float, default=0.45,
                   help="skewed variant: the share of requests sent to the hot tenant (plus its uniform share)")
    p.add_argument("--variants", nargs="+", default=["uniform", "skewed"], choices=["uniform", "skewed"])
    p.add_argument("--policies", nargs="+", default=POLICIES, choices=POLICIES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks-per-replica", type=_positive_int, default=None,
                   help=f"KV blocks of each replica (default: room for {KV_FIT:.0%} of the tenants' prompts)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--out", default=None, help="write the report as JSON here")
    p.add_argument("--simulate", action="store_true", help="the replicas simulated (bench/router_sim.py)")
    p.add_argument("--calibrate", action="store_true", help="with --simulate: measure the step costs first")
    p.add_argument("--sim-slowdown", type=float, default=1.0,
                   help="with --simulate: every replica step cost times this (an overloaded cluster)")


def _positive_int(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return n


def workload(a, variant: str):
    rng = random.Random(a.seed)
    systems = [f"Tenant {t}. " + " ".join(rng.choice(WORDS) for _ in range(a.system_words)) for t in range(a.tenants)]
    reqs, t = [], 0.0
    for i in range(a.requests):
        t += rng.expovariate(a.rate)
        if variant == "skewed" and rng.random() < a.skew:
            k = 0
        else:
            k = rng.randrange(a.tenants)
        user = " ".join(rng.choice(WORDS) for _ in range(12))
        reqs.append((t, systems[k] + f"\nUser {i}: {user}\nAssistant:"))
    return reqs


def kv_blocks_per_replica(a, tokenizer) -> int:
    """--kv-blocks-per-replica, or room for KV_FIT of the tenants' prompts (at least KV_RUNNING
    whole requests)."""
    prompt_tokens = max(len(tokenizer.encode(p)) for _, p in workload(a, "uniform")[:8])
    request_blocks = -(-(prompt_tokens + a.max_tokens) // a.block_size)
    if a.kv_blocks_per_replica is not None:
        if a.kv_blocks_per_replica < request_blocks:
            raise SystemExit(f"llmkern bench router: --kv-blocks-per-replica: {a.kv_blocks_per_replica} blocks "
                             f"cannot hold one request ({request_blocks} blocks of {a.block_size} tokens)")
        return a.kv_blocks_per_replica
    return max(int(KV_FIT * a.tenants * request_blocks), KV_RUNNING * request_blocks)


def _spawn(args, env=None, cpus=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "llmkern.cli", *args], env=e, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=child_setup(cpus))


def _wait_health(url: str, timeout: float = 300) -> None:
    wait_healthy(url + "/health", timeout, what=url)


def _hits(url: str):
    import httpx

    q = h = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llmkern:prefix_cache_queries_total"):
            q = float(line.split()[-1])
        elif line.startswith("llmkern:prefix_cache_hits_total"):
            h = float(line.split()[-1])
    return q, h


async def _drive(base: str, reqs, max_tokens: int):
    import httpx

    async def one(client, at, prompt, t0):
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        start = time.perf_counter()
        ttft = None
        n = 0
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
        async with client.stream("POST", base + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    n += 1
        return ttft, n

    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        out = await asyncio.gather(*[one(client, at, p, t0) for at, p in reqs])
        return out, time.perf_counter() - t0


def _pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_policy(a, policy: str, reqs, model: str, num_blocks: int) -> dict:
    import httpx

    from ..router.launch import split_cpus, stop_replicas

    shares = split_cpus(a.replicas)
    reps = []
    router = None
    try:
        for i in range(a.replicas):
            port = free_port()
            cpus = shares[i][:a.threads_per_replica]
            reps.append((_spawn(["serve", "--model", model, "--port", str(port), "--block-size", str(a.block_size),
                                 "--num-gpu-blocks-override", str(num_blocks)],
                                {"OMP_NUM_THREADS": str(len(cpus))}, cpus), f"http://127.0.0.1:{port}"))
        rport = free_port()
        args = ["router", "--model", model, "--policy", policy, "--port", str(rport)]
        for _, u in reps:
            args += ["--worker", u]
        router = _spawn(args)
        base = f"http://127.0.0.1:{rport}"
        for _, u in reps:
            _wait_health(u)
        _wait_health(base)
        time.sleep(1.5)                        # the router's first KV sync and health round
        res, wall = asyncio.run(_drive(base, reqs, a.max_tokens))
        workers = httpx.get(base + "/admin/workers", timeout=10).json()["workers"]
        q = h = 0.0
        for _, u in reps:
            qi, hi = _hits(u)
            q, h = q + qi, h + hi
        ttfts = [t for t, _ in res]
        counts = [w["requests"] for w in workers]
        return {"policy": policy, "hit_rate": h / q if q else 0.0, "ttft_p50_s": _pct(ttfts, 0.5),
                "ttft_p99_s": _pct(ttfts, 0.99), "req_per_s": len(res) / wall,
                "output_tok_per_s": sum(n for _, n in res) / wall, "requests_per_replica": counts,
                "imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else None,
                "retries": sum(w["retried"] for w in workers), "failures": sum(w["failed"] for w in workers)}
    finally:
        if router is not None and router.poll() is None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(10)
            except subprocess.TimeoutExpired:
                router.kill()
        stop_replicas(reps, 10)


def run_bench(a) -> dict:
    from ..models.loader import default_model_path, load_tokenizer
    from . import router_sim

    model = a.model or default_model_path()
    tok = load_tokenizer(model)
    num_blocks = kv_blocks_per_replica(a, tok)
    report = {"args": {k: v for k, v in vars(a).items() if not callable(v)}, "variants": {},
              "kv_blocks_per_replica": num_blocks}
    print(f"{a.replicas} replicas x {num_blocks} KV blocks of {a.block_size} tokens, {a.tenants} tenants, "
          f"{a.requests} requests at {a.rate}/s, load average {os.getloadavg()[0]:.2f}"
          + (" (simulated)" if a.simulate else ""), flush=True)
    if a.simulate:
        costs = router_sim.calibrate(model, a.threads_per_replica) if a.calibrate else router_sim.Costs()
        costs = costs.slowed(a.sim_slowdown)
        print(f"replica model: {costs}", flush=True)
        report["sim_costs"] = vars(costs)
    for variant in a.variants:
        if a.simulate:
            treqs = [(t, p, tok.encode(p)) for t, p in workload(a, variant)]
            rows = [router_sim.simulate(pol, treqs, a.replicas, num_blocks, costs, a.block_size, a.max_tokens)
                    for pol in a.policies]
            for row in rows:
                print(_fmt(variant, row), flush=True)
        else:
            reqs = workload(a, variant)
            rows = []
            for pol in a.policies:
                row = run_policy(a, pol, reqs, model, num_blocks)
                rows.append(row)
                print(_fmt(variant, row), flush=True)
                report["variants"][variant] = rows
                _save(a, report)               # a long run stopped early keeps what it measured
        report["variants"][variant] = rows
        oracle = next((r for r in rows if r["policy"] == "prefix_only"), None)
        if oracle and oracle["hit_rate"]:
            for r in rows:
                r["hit_vs_oracle"] = r["hit_rate"] / oracle["hit_rate"]
        report.setdefault("targets", {})[variant] = t = targets(rows)
        if t:
            print(f"{variant:8s} " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()), flush=True)
    report["load_average_end"] = os.getloadavg()[0]
    _save(a, report)
    return report


def targets(rows) -> dict:
    """Issue 19's ratios for cache_aware (those whose policies ran): hit rate over the oracle's,
    round_robin's TTFT p50 over cache_aware's, hit rate and TTFT p99 over least_load's (the oracle's
    hit ratio beside it: what is reachable), hit rate and TTFT over approx_tree's."""
    by = {r["policy"]: r for r in rows}
    ca = by.get("cache_aware")
    if ca is None:
        return {}
    out = {}

    def ratio(key, a, b, name):
        if a is not None and b is not None and a.get(key) and b.get(key):
            out[name] = a[key] / b[key]

    ratio("hit_rate", ca, by.get("prefix_only"), "hit/oracle")
    ratio("ttft_p50_s", by.get("round_robin"), ca, "rr_p50/p50")
    ratio("hit_rate", ca, by.get("least_load"), "hit/ll")
    ratio("hit_rate", by.get("prefix_only"), by.get("least_load"), "oracle_hit/ll")
    ratio("ttft_p99_s", ca, by.get("least_load"), "p99/ll")
    ratio("hit_rate", ca, by.get("approx_tree"), "hit/at")
    ratio("ttft_p50_s", ca, by.get("approx_tree"), "p50/at")
    ratio("ttft_p99_s", ca, by.get("approx_tree"), "p99/at")
    return out


def _save(a, report: dict) -> None:
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


def _fmt(variant, r) -> str:
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    return (f"{variant:8s} {r['policy']:12s} hit {r['hit_rate']:.3f}  TTFT p50 {f(r['ttft_p50_s'])} s  "
            f"p99 {f(r['ttft_p99_s'])} s  {r['req_per_s']:.2f} req/s  per replica {r['requests_per_replica']}")


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(prog="llmkern bench router", description=__doc__.split("\n\n")[0])
    add_args(ap)
    run_bench(ap.parse_args(argv))
    return 0
