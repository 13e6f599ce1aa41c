"""`llmkern bench NAME`: the named benchmarks (throughput, serve, router, pd) and the chaos run;
the kernel/e2e suite and its report are bench_suite.py."""
from __future__ import annotations

import argparse
import json
from typing import Callable, Dict, Tuple

from .common import SERVE_HINT, check_device, fail


def _bench_router_args(p: argparse.ArgumentParser) -> None:
    from ..bench.routing import add_args

    add_args(p)


def _bench_router(a) -> int:
    from ..bench.routing import run_bench

    run_bench(a)
    return 0


def _bench_pd_args(p: argparse.ArgumentParser) -> None:
    from ..bench.disagg import add_args

    add_args(p)


def _bench_pd(a) -> int:
    from ..bench.disagg import run_bench

    run_bench(a)
    return 0


# -- bench -------------------------------------------------------------------------------------
def _bench_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer requests and tokens")
    p.add_argument("--num-requests", type=int, default=None, help="override the request count (e.g. 256)")
    p.add_argument("--no-peers", action="store_true", help="skip HF transformers")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", default=None, help="also write the records to this file")


def _bench_throughput(a) -> int:
    import importlib.util

    from ..bench import throughput as benchmark

    if not a.no_peers and importlib.util.find_spec("transformers") is None:
        raise fail("bench throughput: the HF transformers peer needs transformers "
                    "(pip install \"llmkern[bench]\"), or pass --no-peers")
    try:
        check_device(a.device)
    except ValueError as e:
        raise fail(f"--{e}")
    recs = benchmark.throughput(quick=a.quick, device=a.device, num_requests=a.num_requests,
                                peers=not a.no_peers)
    benchmark.print_table(recs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


def _bench_serve_args(p: argparse.ArgumentParser) -> None:
    from ..bench.serving import add_args

    add_args(p)


def _bench_serve(a) -> int:
    try:
        from ..bench.serving import main as bench_main
    except ImportError as e:
        raise SystemExit(f"{SERVE_HINT} ({e})")
    return bench_main(a)


def _bench_chaos_args(p: argparse.ArgumentParser) -> None:
    from ..bench.chaos import add_args

    add_args(p)


def _bench_chaos(a) -> int:
    try:
        from ..bench.chaos import main as chaos_main
    except ImportError as e:
        raise SystemExit(f"{SERVE_HINT} ({e})")
    return chaos_main(a)


# name -> (help, add_arguments(parser), run(args) -> exit code); more benchmarks plug in here.
BENCH_COMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "throughput": ("end-to-end offline throughput (offline-32 workload) vs HF transformers",
                   _bench_throughput_args, _bench_throughput),
    "serve": ("serving: open-loop Poisson load on `llmkern serve` (three policies) vs HF's `transformers serve`; "
              "with --peer vllm: beside vLLM's server, alternating, same clients",
              _bench_serve_args, _bench_serve),
    "router": ("routing: multi-tenant Poisson load on N replicas behind the router, per policy (hit rate, TTFT)",
               _bench_router_args, _bench_router),
    "pd": ("prefill-decode disaggregation: chat decoding + long-prompt bursts, co-located vs 1P1D (TTFT, ITL, KV "
           "bytes moved)", _bench_pd_args, _bench_pd),
    "chaos": ("failure handling: steady load on `serve --data-parallel-size 2` with a replica SIGKILLed and poison "
              "requests; completed / failed cleanly / lost (must be 0), restarts, recovery time", _bench_chaos_args,
              _bench_chaos),
}
