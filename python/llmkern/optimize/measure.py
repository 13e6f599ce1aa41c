"""Measuring one configuration: through `llmkern serve` (a subprocess on a loopback port, driven by
the load generator's open-loop client, llmkern.loadgen) or in-process with LLM.generate for offline workloads.
Both return the database's metric names and one latency row per request."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .. import loadgen
from ..procs import ServerProcess, llmkern_serve_argv
from ..engine.metrics import percentile
from . import knobs as knobs_mod
from .grammar import Constraint
from ..machine_load import LoadMeter

SERVED_NAME = "llmkern-optimize"


def metrics_from_rows(rows: Sequence[dict], wall: float, constraints: Sequence[Constraint] = (),
                      refused: int = 0) -> Dict[str, Optional[float]]:
    """rows: per-request dicts (ok, ttft, e2e_latency, itls, output_tokens, prompt_tokens)."""
    ok = [r for r in rows if r["ok"]]
    series = {"ttft": [r["ttft"] for r in ok], "itl": [x for r in ok for x in (r.get("itls") or [])],
              "e2e_latency": [r["e2e_latency"] for r in ok]}
    out_toks = sum(r["output_tokens"] or 0 for r in ok)
    prompt_toks = sum(r.get("prompt_tokens") or 0 for r in ok)
    wall = max(wall, 1e-9)
    m: Dict[str, Optional[float]] = {
        "requests": len(rows), "completed": len(ok), "failed": len(rows) - len(ok), "refused": refused,
        "duration": wall, "output_throughput": out_toks / wall, "total_throughput": (out_toks + prompt_toks) / wall,
        "request_throughput": len(ok) / wall}
    for name, xs in series.items():
        m[f"{name}_mean"] = sum(xs) / len(xs) if xs else None
        m[f"{name}_median"] = percentile(xs, 50)
        m[f"{name}_p95"] = percentile(xs, 95)
        m[f"{name}_p99"] = percentile(xs, 99)
    # Goodput: requests per second whose own TTFT, mean ITL and E2E meet every constraint's limit.
    limits = {c.metric: c.limit_s for c in constraints}

    def good(r):
        own = {"ttft": r["ttft"], "itl": r.get("itl_mean"), "e2e_latency": r["e2e_latency"]}
        return all(own[k] is None or own[k] <= v for k, v in limits.items())

    m["goodput"] = sum(1 for r in ok if good(r)) / wall
    return m


def _rows(results: Sequence[loadgen.Result], prompt_tokens: Sequence[int]) -> List[dict]:
    rows = []
    for r, p in zip(results, prompt_tokens):
        rows.append({"ok": r.ok, "ttft": r.ttft, "e2e_latency": r.e2e, "itls": list(r.itls),
                     "itl_mean": (sum(r.itls) / len(r.itls)) if r.itls else None,
                     "output_tokens": r.tokens, "prompt_tokens": p})
    return rows


def measure_serve(model: Optional[str], server_knobs: dict, client_knobs: dict, reqs: List[loadgen.Req],
                  prompt_tokens: Sequence[int], constraints: Sequence[Constraint], timeout: float,
                  extra_serve_args: Sequence[str] = (), server=None) -> Tuple[Dict, List[dict], Dict]:
    """Start `llmkern serve` with the configuration's flags (or `server`, a frameworks.Server: another
    framework's), warm it with one request, run the workload, stop the server. RuntimeError (with
    the server's log tail) when it fails to start. The third value is the machine's load over the
    run (machine_load.LoadMeter: the server's own CPU time is not counted as load)."""
    meter = LoadMeter().start()
    if server is None:
        argv = llmkern_serve_argv(["--served-model-name", SERVED_NAME] + list(extra_serve_args)
                                    + knobs_mod.serve_flags(server_knobs), model)
        srv = ServerProcess("llmkern serve", argv, timeout=min(timeout, 300))
    else:
        srv = ServerProcess(server.argv[0], server.argv, env=dict(os.environ, **server.env), timeout=server.timeout)
    try:
        # ignore_eos: every request produces exactly its max_tokens
        asyncio.run(loadgen.drive(srv.base, SERVED_NAME, [loadgen.Req(0.0, "Hello", 4)], timeout,
                                  extra={"ignore_eos": True}))
        results, wall = asyncio.run(loadgen.drive(srv.base, SERVED_NAME, reqs, timeout,
                                                  max_concurrency=client_knobs.get("max_concurrency"),
                                                  extra={"ignore_eos": True}))
        if srv.proc.poll() is not None:
            raise RuntimeError(f"the server exited with {srv.proc.returncode} during the run: {srv.tail()}")
        load = meter.stop()   # before the server goes: its CPU time is its own, not other work's
    finally:
        srv.close()
    rows = _rows(results, prompt_tokens)
    refused = sum(1 for r in results if r.status == 429)
    return metrics_from_rows(rows, wall, constraints, refused), rows, load


def measure_offline(model: Optional[str], server_knobs: dict, prompt_ids: Sequence[List[int]],
                    max_tokens: Sequence[int], constraints: Sequence[Constraint],
                    load_format: str = "auto", extra_engine: Optional[dict] = None) -> Tuple[Dict, List[dict], Dict]:
    """LLM.generate over token-id prompts in this process (every request arrives at once)."""
    from ..engine import LLM, SamplingParams

    kw = dict(extra_engine or {})
    kw.update(knobs_mod.engine_kwargs(server_knobs))
    meter = LoadMeter().start()
    llm = LLM(model, load_format=load_format, **kw)
    try:
        llm.generate([prompt_ids[0]], [SamplingParams(max_tokens=2, temperature=0.0)], use_tqdm=False)  # warm-up
        sps = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
        t0 = time.perf_counter()
        outs = llm.generate(list(prompt_ids), sps, use_tqdm=False)
        wall = time.perf_counter() - t0
        load = meter.stop()
    finally:
        shutdown = getattr(llm, "shutdown", None)
        if shutdown:
            shutdown()
    rows = []
    for o, p in zip(outs, prompt_ids):
        mt = o.metrics
        itls = list(mt.inter_token_latencies) if mt else []
        ok = o.error is None and mt is not None and mt.ttft is not None
        rows.append({"ok": ok, "ttft": mt.ttft if mt else None, "e2e_latency": mt.e2e if mt else None,
                     "itls": itls, "itl_mean": (sum(itls) / len(itls)) if itls else None,
                     "output_tokens": len(o.outputs[0].token_ids) if o.outputs else 0, "prompt_tokens": len(p)})
    return metrics_from_rows(rows, wall, constraints), rows, load


def log(msg: str) -> None:
    print(f"[optimize] {msg}", file=sys.stderr, flush=True)
