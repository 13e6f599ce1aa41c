"""Serving benchmark: `llmkern serve` (each scheduling policy) vs HF's `transformers serve`, open-loop
Poisson load, TTFT/ITL/E2E percentiles and goodput; plus the burst-of-32 server vs in-process ratio.
The same as `llmkern bench serve`; see llmkern/bench/serving.py for the workload and options.
In the suite (`llmkern bench e2e`), run() reports TTFT p95 per rate against the HF server and, when
vLLM is installed ($LLMKERN_VLLM_EXE or `vllm` on PATH), TTFT p50 against `vllm serve` on the same
weights (serve_compare.py; --quick: one rate, few prompts, fp32, the random workload)."""
import argparse
import sys

from llmkern.bench import common

SUITE = "e2e"


def run(quick: bool = False, device: str = "cpu"):
    from llmkern.bench import serving as bench

    if device != "cpu":
        raise SystemExit("bench_serve: CPU only (the server picks its own device)")
    if quick:
        a = bench.quick_args()
    else:
        ap = argparse.ArgumentParser()
        bench.add_args(ap)
        a = ap.parse_args(["--policies", "continuous", "--out", bench.tempfile.mkdtemp(prefix="llmkern-bench-serve-")])
    report = bench.run_bench(a)
    rows = report["rows"]
    peer = {r["rate"]: r for r in rows if r["system"].startswith("HF")}
    recs = []
    for r in rows:
        if r["system"].startswith("HF") or r["ttft_p95"] is None:
            continue
        h = peer.get(r["rate"])
        recs.append(common.Record(
            "serve/ttft_p95", f"{r['system']} @ {r['rate']} req/s, {r['requests']} requests", r["ttft_p95"],
            "HF transformers serve", h["ttft_p95"] if h else None, "goodput req/s", r["goodput_rps"],
            extra={"row": r, "peer_row": h}))
    vllm_recs, why = _vs_vllm(quick)
    recs += vllm_recs
    if why:
        print(f"bench_serve: vLLM peer {why}")
        if recs:
            recs[0].extra["vllm peer"] = why
    b = report.get("burst")
    if b:
        recs.append(common.Record("serve/burst", f"{b['requests']} requests at once", 1 / b["server_tok_s"],
                                  "in-process LLM.generate", 1 / b["inprocess_tok_s"], "tok/s", b["server_tok_s"],
                                  extra=b, axes={"requests": b["requests"], "series": "server burst"}))
    return recs


def _vs_vllm(quick: bool):
    """(records of TTFT p50 llmkern vs `vllm serve`, "" or why it did not run)."""
    from llmkern.bench import peers_serving, serving
    from llmkern.bench.serve_compare import run_compare
    from llmkern.bench.serve_compare_report import merge

    if peers_serving.find_vllm(None) is None:
        return [], peers_serving.vllm_peer(None).not_run
    ap = argparse.ArgumentParser()
    serving.add_args(ap)
    argv = ["--peer", "vllm", "--out", serving.tempfile.mkdtemp(prefix="llmkern-bench-serve-vllm-")]
    if quick:
        argv += ["--rates", "2", "--num-prompts", "8", "--dtypes", "float32", "--rounds", "1", "--workloads", "random"]
    rep = run_compare(serving.resolve_defaults(ap.parse_args(argv)), serving.hf_model_dir)
    merged = merge(rep["rows"])
    ours = {(m["dtype"], m["workload"], m["rate"], m["client"]): m for m in merged if m["system"] == "llmkern"}
    recs = []
    for m in merged:
        o = ours.get((m["dtype"], m["workload"], m["rate"], m["client"]))
        if m["system"] != "vllm" or o is None or not o["ttft_p50"] or not m["ttft_p50"]:
            continue
        recs.append(common.Record(
            "serve/ttft_p50_vs_vllm", f"{m['workload']} @ {m['rate']} req/s, {m['dtype']}, {m['client']} client",
            o["ttft_p50"]["median"], "vllm serve (CPU)", m["ttft_p50"]["median"], "s TTFT p50",
            o["ttft_p50"]["median"], extra={"llmkern": o, "vllm": m, "cpu": rep["cpu"]}))
    return recs, "" if recs else "ran but gave no comparable rows: " + "; ".join(rep["notes"])[-500:]


def main(argv=None) -> int:
    from llmkern.bench.serving import add_args, main as serve_main

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    return serve_main(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
