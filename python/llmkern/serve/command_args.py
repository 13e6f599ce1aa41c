"""All options of `llmkern serve`: the engine's, the server's, data parallelism and the
prefill-decode roles. The CLI builds the command from here, and the optimiser reads it to map
sweep knobs to flags."""
from __future__ import annotations

import argparse

from ..engine.args import HelpFormatter, add_engine_args, engine_kwargs
from ..engine.config import resolve_device
from .config import add_serve_args
from .pd import add_pd_args, engine_kwargs as role_kwargs

# The router policies a data-parallel serve offers (of router/policies.py POLICIES), by name: the
# serve command launches the router in another process and only passes the name on.
ROUTER_POLICIES = ["cache_aware", "approx_tree", "least_load", "round_robin"]


def add_serve_command_args(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    add_serve_args(p)
    dp = p.add_argument_group("data parallelism")
    dp.add_argument("--data-parallel-size", type=int, default=1,
                    help="N > 1: N replicas (the CPUs split between them, or one GPU each) behind a router on --port")
    dp.add_argument("--router-policy", default="cache_aware", choices=ROUTER_POLICIES)
    add_pd_args(p)


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmkern serve", formatter_class=HelpFormatter)
    add_serve_command_args(p)
    return p


# A server's token budget per step on a CPU. 48 x 256-token prompts at once, 64 tokens out each,
# SmolLM2 in-process on a 2-vCPU Xeon with AMX: 1024 against 512 gave p99 first
# token 2.9-3.0 s vs 3.3-3.4 (bf16, deferral 1; fp32, deferral 0: 11.8-12.4 vs 12.8-13.3), p50 up to
# 4% sooner, 3-5% more tokens/s,
# TPOT even. 2048 lost on the fp32 median (7.6 vs 6.7 s): a step's prompts finish together, and an
# fp32 step of 2048 tokens takes ~2 s. (On 2 Zen 4 cores, 512 had beaten 2048 by 25-30% on the median.)
CPU_SERVE_BUDGET = 1024


def serve_engine_kwargs(a) -> dict:
    """EngineConfig keyword arguments of a serve (or generate/embed) command, the role's included."""
    kw = dict(engine_kwargs(a), kv_prefault=getattr(a, "kv_prefault", False),
              decode_defer_steps=getattr(a, "decode_defer_steps", 0), **role_kwargs(a))
    if hasattr(a, "kv_prefault") and a.max_num_batched_tokens is None and resolve_device(a.device).type == "cpu":
        kw["max_num_batched_tokens"] = CPU_SERVE_BUDGET
    return kw
