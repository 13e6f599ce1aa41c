"""The offline-job options and runner shared by `generate --input` and `embed`."""
from __future__ import annotations

import argparse
import functools
import sys

from .common import engine_kwargs, make_llm


def add_job_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("offline job (--input)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--resume", action="store_true",
                   help="--output holds results of an earlier run of this job: keep them, run only the rest")
    m.add_argument("--overwrite", action="store_true", help="discard results already in --output")
    g.add_argument("--schedule", default="throughput", choices=["throughput", "arrival"],
                   help="throughput: prompts sharing a prefix grouped and the prefix computed once, biggest "
                        "groups first (default); arrival: input order")
    g.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                   help="machine price per hour: the summary adds the cost per million tokens")
    g.add_argument("--ray", action="store_true", help="run the lines on Ray Data (pip install 'llmkern[ray]')")
    g.add_argument("--ray-address", default=None, help="existing Ray cluster (default: start a local one)")
    g.add_argument("--ray-actors", type=int, default=1, help="engines (Ray actors), one per replica")
    g.add_argument("--ray-cpus-per-actor", type=float, default=1.0)
    g.add_argument("--ray-gpus-per-actor", type=float, default=0.0)
    g.add_argument("--ray-batch-size", type=int, default=64, help="lines per map_batches call")


def run_job_command(task, a) -> int:
    from ..offline import JobError, run_job

    if a.price_per_hour is not None and a.price_per_hour < 0:
        raise SystemExit("llmkern: --price-per-hour: expected a price >= 0")
    if a.ray and a.output is None:
        raise SystemExit("llmkern: --ray needs --output")
    mode = "resume" if a.resume else "overwrite" if a.overwrite else None
    on_ray = None
    if a.ray:
        if a.ray_actors < 1 or a.ray_batch_size < 1:
            raise SystemExit("llmkern: --ray-actors and --ray-batch-size: expected integers >= 1")
        from ..integrations.ray import run_on_ray

        on_ray = functools.partial(run_on_ray, model=a.model, load_format=a.load_format,
                                   engine_kwargs=engine_kwargs(a), address=a.ray_address, num_actors=a.ray_actors,
                                   batch_size=a.ray_batch_size, num_cpus=a.ray_cpus_per_actor,
                                   num_gpus=a.ray_gpus_per_actor, progress=not a.quiet)
    try:
        s = run_job(task, a.input, a.output, mode, llm_factory=lambda: make_llm(a), run_elsewhere=on_ray,
                    progress=not a.quiet)
    except JobError as e:
        raise SystemExit(f"llmkern: {e}")
    except KeyboardInterrupt:
        if a.output:
            print(f"llmkern: interrupted; finished results are in {a.output} (run again with --resume)",
                  file=sys.stderr)
        return 130
    if not a.quiet:
        from ..engine.metrics import format_summary

        if s.engine is not None:
            print(format_summary(s.engine), file=sys.stderr)
        print(s.format(a.price_per_hour) + (f" | {s.errors} bad line(s) skipped" if s.errors else "")
              + (f" | {s.dropped} result(s) of ids no longer in the input dropped" if s.dropped else ""),
              file=sys.stderr)
    return 1 if s.errors else 0
