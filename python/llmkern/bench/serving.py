"""Serving benchmark (`llmkern bench serve`, bench/bench_serve.py).

Starts each server as a subprocess on a free loopback port and drives it with an open-loop async
client: Poisson arrivals at several rates, a seeded mix of short chat turns and long-prompt
requests, streaming on, greedy. Per system and rate: TTFT / ITL / E2E p50-p95-p99, output tok/s and
goodput (requests per second that meet the SLO: TTFT <= slo_ttft_s and mean inter-token latency
<= slo_itl_s). Systems: `llmkern serve` with each scheduling policy (continuous, dynamic, static,
and continuous with the TTFT-SLO admission), and HF transformers' own OpenAI-compatible server
(`transformers serve --continuous-batching`) on the same weights. Also a burst of 32 requests
through the server against the same requests through LLM.generate in-process.

With --peer vllm|sglang: `llmkern serve` beside those servers instead, alternating rounds, the same
token-id workloads and clients for all (serve_compare.py)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional

from ..loadgen import Req, chat_mix as workload, drive, summarise
from ..procs import ServerProcess, llmkern_serve_argv as llmkern_argv

# -- servers ------------------------------------------------------------------------------------------
def hf_model_dir(path: str) -> str:
    """The embedded SmolLM2 weights and tokenizer as a HF directory (what `transformers serve` loads)."""
    from ..models.loader import default_model_path, read_gguf, save_hf_dir

    cfg, sd, tok = read_gguf(default_model_path())
    save_hf_dir(cfg, sd, path)
    tok.tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template,
                   "bos_token": tok.special_tokens.get("bos_token"), "eos_token": tok.special_tokens.get("eos_token"),
                   "add_bos_token": tok.add_bos, "model_max_length": cfg.max_position_embeddings}, f)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.eos_token_ids, "bos_token_id": tok.bos_token_id}, f)
    return path


# -- burst: server vs in-process ----------------------------------------------------------------------
def burst_ratio(base: str, model: str, n: int = 32, seed: int = 1, rounds: int = 2) -> dict:
    """n completions at once through the server vs LLM.generate in this process (same token-id
    prompts, greedy, fixed output lengths): output tok/s of each and the ratio. The two alternate
    for `rounds` rounds and the best of each counts (the machine may be shared)."""
    import httpx

    from ..engine import LLM, SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 49152) for _ in range(rng.randint(32, 128))] for _ in range(n)]
    outs = [rng.randint(32, 64) for _ in range(n)]

    async def server_once():
        async with httpx.AsyncClient(timeout=600) as c:
            async def one(p, m):
                r = await c.post(base + "/v1/completions", json={"model": model, "prompt": p, "max_tokens": m,
                                                                  "temperature": 0, "ignore_eos": True})
                return r.json()["usage"]["completion_tokens"]

            t0 = time.perf_counter()
            toks = await asyncio.gather(*[one(p, m) for p, m in zip(prompts, outs)])
            return sum(toks) / (time.perf_counter() - t0)

    llm = LLM()
    sps = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in outs]
    llm.generate(prompts[:2], sps[:2], use_tqdm=False)   # warm-up, as the server has had

    def inprocess_once():
        t0 = time.perf_counter()
        res = llm.generate(prompts, sps, use_tqdm=False)
        return sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)

    srv, inp = [], []
    for _ in range(rounds):
        srv.append(asyncio.run(server_once()))
        inp.append(inprocess_once())
    del llm
    return {"requests": n, "server_tok_s": round(max(srv), 2), "inprocess_tok_s": round(max(inp), 2),
            "ratio": round(max(srv) / max(inp), 3), "server_samples": [round(x, 2) for x in srv],
            "inprocess_samples": [round(x, 2) for x in inp]}


# -- report -------------------------------------------------------------------------------------------
def table(rows: List[dict]) -> str:
    cols = ["system", "rate", "completed", "refused", "ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p95",
            "itl_p99", "e2e_p50", "e2e_p95", "e2e_p99", "out_tok_s", "goodput_rps"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def plot(rows: List[dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    systems = sorted({r["system"] for r in rows}, key=lambda s: [x["system"] for x in rows].index(s))
    for s in systems:
        rs = sorted((r for r in rows if r["system"] == s), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        for ax, key in zip(axes, ("ttft_p95", "itl_p95", "e2e_p95", "goodput_rps")):
            ax.plot(x, [r[key] if r[key] is not None else float("nan") for r in rs], marker="o", label=s)
            ax.set_title(key.replace("_", " ") + (" (s)" if key != "goodput_rps" else " (req/s)"))
            ax.set_xlabel("request rate (req/s)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def add_args(p: argparse.ArgumentParser) -> None:
    # Defaults that differ between the policy sweep and the comparison with peers are None here and
    # filled in by resolve_defaults().
    p.add_argument("--rates", type=float, nargs="+", default=None,
                   help="request rates (req/s; inf: all at once); default 0.5 1 2, with --peer 1 2 3 4 inf")
    p.add_argument("--num-requests", "--num-prompts", dest="num_requests", type=int, default=None,
                   help="requests per rate (default 24; with --peer 48 per workload and rate)")
    p.add_argument("--policies", nargs="*", default=["continuous", "dynamic", "static", "continuous+slo"],
                   help="llmkern scheduling policies to run (none: only the peer); not with --peer")
    p.add_argument("--max-batch-size", type=int, default=8, help="static/dynamic batch size")
    p.add_argument("--max-wait-ms", type=float, default=200.0)
    p.add_argument("--slo-ttft-s", type=float, default=None, help="goodput's TTFT bound (default 2; with --peer 1)")
    p.add_argument("--slo-itl-s", type=float, default=0.2)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--no-peers", action="store_true", help="skip HF's `transformers serve`")
    p.add_argument("--no-burst", action="store_true", help="skip the burst-of-32 server vs in-process ratio")
    p.add_argument("--timeout", type=float, default=None, help="seconds per (system, rate) run (default 240; with "
                   "--peer 600: 48 prompts at once on a slow server)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results", help="folder for serve.json, serve.md, serve.png")
    g = p.add_argument_group("comparison with other servers (--peer; bench/serve_compare.py)")
    g.add_argument("--peer", action="append", default=[],
                   help="vllm or sglang (repeatable, or a comma list): `llmkern serve` beside it, alternating")
    g.add_argument("--peer-command", action="append", default=[], help=argparse.SUPPRESS)   # NAME=ARGV (tests)
    g.add_argument("--workloads", nargs="+", default=["random", "shared-prefix", "mixed"])
    g.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    g.add_argument("--rounds", type=int, default=2, help="alternating rounds (each system gets a fresh server)")
    g.add_argument("--client", choices=["ours", "vllm", "both"], default=None,
                   help="llmkern's open-loop client, `vllm bench serve`, or both (default: both if vllm is there)")
    g.add_argument("--vllm-exe", default=None, help="the vllm executable (default: $LLMKERN_VLLM_EXE, else on PATH)")
    g.add_argument("--sglang-python", default=None, help="python that has sglang (default: this one)")
    g.add_argument("--slo-tpot-s", type=float, default=0.25, help="goodput's TPOT bound")
    g.add_argument("--max-model-len", type=int, default=2048, help="context length of every server")
    g.add_argument("--input-len", type=int, default=256, help="random: prompt tokens")
    g.add_argument("--output-len", type=int, default=64, help="random, shared-prefix: output tokens")
    g.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens of the shared prefix")
    g.add_argument("--suffix-len", type=int, default=64, help="shared-prefix: unique tokens after it")


def resolve_defaults(a) -> argparse.Namespace:
    """The mode's defaults for the options left unset (see add_args)."""
    compare = bool(a.peer or a.peer_command)
    if a.rates is None:
        a.rates = [1.0, 2.0, 3.0, 4.0, float("inf")] if compare else [0.5, 1.0, 2.0]
    if a.num_requests is None:
        a.num_requests = 48 if compare else 24
    if a.slo_ttft_s is None:
        a.slo_ttft_s = 1.0 if compare else 2.0
    if a.timeout is None:
        a.timeout = 600.0 if compare else 240.0
    return a


def _policy_args(policy: str, a) -> List[str]:
    if policy == "continuous":
        return ["--scheduler", "continuous", "--max-num-seqs", "32"]
    if policy == "continuous+slo":
        return ["--scheduler", "continuous", "--max-num-seqs", "32", "--slo-ttft-ms", str(1e3 * a.slo_ttft_s)]
    if policy == "dynamic":
        return ["--scheduler", "dynamic", "--max-batch-size", str(a.max_batch_size), "--max-wait-ms",
                str(a.max_wait_ms)]
    if policy == "static":
        return ["--scheduler", "static", "--max-batch-size", str(a.max_batch_size)]
    raise SystemExit(f"--policies: unknown policy {policy!r}")


def _save_partial(a, rows) -> None:
    with open(os.path.join(a.out, "serve.partial.json"), "w") as f:
        json.dump(rows, f, indent=1)


def _run_system(name, server, model, a, rows) -> None:
    # One request first: HF's continuous-batching manager starts (and warms up) on first use.
    asyncio.run(drive(server.base, model, [Req(0.0, "Hello", 8)], a.timeout))
    for rate in a.rates:
        reqs = workload(a.num_requests, rate, a.seed)
        results, wall = asyncio.run(drive(server.base, model, reqs, a.timeout))
        row = summarise(name, rate, results, wall, a.slo_ttft_s, a.slo_itl_s)
        rows.append(row)
        _save_partial(a, rows)
        print(f"[serve] {name} @ {rate} req/s: {row['completed']}/{row['requests']} done, TTFT p95 "
              f"{row['ttft_p95']} s, ITL p95 {row['itl_p95']} s, {row['out_tok_s']} tok/s, goodput "
              f"{row['goodput_rps']} req/s", file=sys.stderr, flush=True)


def quick_args() -> argparse.Namespace:
    """The settings of the suite's --quick run: one rate, few requests, continuous + the peer."""
    ap = argparse.ArgumentParser()
    add_args(ap)
    return ap.parse_args(["--rates", "0.5", "--num-requests", "8", "--policies", "continuous", "--no-burst",
                          "--out", tempfile.mkdtemp(prefix="llmkern-bench-serve-")])


def main(a) -> int:
    run_bench(a)
    return 0


def run_bench(a) -> dict:
    import signal
    import threading

    from ..models.loader import DEFAULT_MODEL_NAME

    if threading.current_thread() is threading.main_thread():   # SIGTERM still closes the servers
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a = resolve_defaults(a)
    if a.peer or a.peer_command:
        from .serve_compare import run_compare

        return run_compare(a, hf_model_dir)

    os.makedirs(a.out, exist_ok=True)
    rows: List[dict] = []
    report: Dict[str, object] = {"slo": {"ttft_s": a.slo_ttft_s, "itl_s": a.slo_itl_s}, "cpus": os.cpu_count(),
                                 "num_requests": a.num_requests, "rates": a.rates}
    model_name = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))
    for policy in a.policies:
        srv = ServerProcess(f"llmkern-{policy}", llmkern_argv(_policy_args(policy, a), a.model))
        try:
            _run_system(f"llmkern {policy}", srv, model_name, a, rows)
            if policy == "continuous" and not a.no_burst:
                report["burst"] = burst_ratio(srv.base, model_name)
                print(f"[serve] burst-32: {report['burst']}", file=sys.stderr, flush=True)
        finally:
            srv.close()
    if not a.no_peers:
        report["peer"] = _run_hf_peer(a, rows)
    report["rows"] = rows
    ours = [r for r in rows if r["system"] == "llmkern continuous"]
    hf = [r for r in rows if r["system"].startswith("HF")]
    if ours and hf:
        report["goodput_ratio_vs_hf"] = {
            str(r["rate"]): (round(r["goodput_rps"] / h["goodput_rps"], 2) if h["goodput_rps"] else None)
            for r in ours for h in hf if h["rate"] == r["rate"]}
    md = table(rows)
    extra = []
    if "burst" in report:
        b = report["burst"]
        extra.append(f"burst of {b['requests']}: server {b['server_tok_s']} tok/s, in-process LLM.generate "
                     f"{b['inprocess_tok_s']} tok/s, ratio {b['ratio']}")
    if report.get("goodput_ratio_vs_hf"):
        extra.append(f"goodput llmkern continuous / HF server, per rate: {report['goodput_ratio_vs_hf']}")
    if isinstance(report.get("peer"), str):
        extra.append(f"HF peer: {report['peer']}")
    text = md + "\n\n" + "\n".join(extra) + "\n"
    print(text)
    with open(os.path.join(a.out, "serve.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write(text)
    plot(rows, os.path.join(a.out, "serve.png"))
    return report


def _run_hf_peer(a, rows) -> str:
    exe = shutil.which("transformers")
    if exe is None:
        return "not run: the `transformers` command is not installed"
    tmp = tempfile.mkdtemp(prefix="llmkern-hf-")
    try:
        path = hf_model_dir(tmp) if a.model is None else a.model
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        try:
            # The KV pool is bounded (1024 blocks of 32 tokens, ~1.5 GB for SmolLM2): sized on its own,
            # HF's continuous-batching cache took ~14 GB on the first long prompt here and was OOM-killed.
            srv = ServerProcess("HF transformers serve", [exe, "serve", "--continuous-batching", "--cb-block-size", "32",
                                                   "--cb-num-blocks", "1024", "--device", "cpu",
                                                   "--dtype", "float32", "--host", "127.0.0.1", "--port", "{port}",
                                                   path], env=env)
        except RuntimeError as e:
            print(f"[serve] HF peer did not start: {e}", file=sys.stderr)
            return f"not run: `transformers serve` did not start ({str(e)[-300:]})"
        try:
            _run_system("HF transformers serve (continuous batching)", srv, path, a, rows)
        finally:
            srv.close()
        return "ran"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    sys.exit(main(ap.parse_args()))
