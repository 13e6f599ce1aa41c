"""Serving benchmark: `llmkern serve` (each scheduling policy) vs HF's `transformers serve`, open-loop
Poisson load, TTFT/ITL/E2E percentiles and goodput; plus the burst-of-32 server vs in-process ratio.
The same as `llmkern bench serve`; see llmkern/bench/serving.py for the workload and options.
In the suite (`llmkern bench e2e`), run() reports TTFT p95 per rate against the HF server."""
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
    b = report.get("burst")
    if b:
        recs.append(common.Record("serve/burst", f"{b['requests']} requests at once", 1 / b["server_tok_s"],
                                  "in-process LLM.generate", 1 / b["inprocess_tok_s"], "tok/s", b["server_tok_s"],
                                  extra=b, axes={"requests": b["requests"], "series": "server burst"}))
    return recs


def main(argv=None) -> int:
    from llmkern.bench.serving import add_args, main as serve_main

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    return serve_main(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
