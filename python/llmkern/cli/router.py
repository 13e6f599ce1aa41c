"""`llmkern router`: the KV-cache-aware router in front of `llmkern serve` replicas."""
from __future__ import annotations

import argparse
import sys

from .common import SERVE_HINT

HELP = "KV-cache-aware router in front of llmkern serve replicas"


def add_args(p: argparse.ArgumentParser) -> None:
    from ..router.policies import POLICIES

    p.add_argument("--worker", action="append", default=None, metavar="URL[,zmq=EP,replay=EP,topic=T]",
                   help="a replica (`llmkern serve`) base URL, e.g. http://10.0.0.5:8000; repeat for more; more "
                        "can be added at run time with POST /admin/workers. With zmq=EP its prefix cache is "
                        "followed from vLLM-format KV events on that ZMQ endpoint (a replica started with "
                        "--kv-events-config, or vLLM) instead of its /kv/events SSE stream")
    p.add_argument("--model", default=None, help="the replicas' model (its tokenizer is loaded to match prefixes)")
    p.add_argument("--pd", action="store_true",
                   help="prefill-decode mode: each request is prefilled on a --prefill replica and continued on "
                        "a --decode replica (which gets the KV blocks)")
    p.add_argument("--prefill", action="append", default=None, metavar="URL",
                   help="with --pd: a `llmkern serve --role prefill` replica; repeat for more")
    p.add_argument("--decode", action="append", default=None, metavar="URL",
                   help="with --pd: a `llmkern serve --role decode` replica; repeat for more")
    p.add_argument("--policy", default="cache_aware", choices=POLICIES)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--admin-key", default=None, help="require header X-Admin-Key on /admin routes")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])


def run(a) -> int:
    try:
        from ..router.core import Router
        from ..router.launch import _router_tokenizer, run_router
    except ImportError as e:
        raise SystemExit(f"{SERVE_HINT} ({e})")
    try:
        tok = _router_tokenizer(a.model) if a.model else None
        if a.pd:
            from ..router.pd import PDRouter

            if a.worker:
                raise ValueError("--worker: in --pd mode replicas are given as --prefill URL and --decode URL")
            router = PDRouter(a.prefill or [], a.decode or [], policy=a.policy, tokenizer=tok)
        elif a.prefill or a.decode:
            raise ValueError("--prefill/--decode: only with --pd")
        else:
            router = Router(a.worker or [], policy=a.policy, tokenizer=tok)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"llmkern router: {e}")
    if tok is None:
        print("llmkern router: no --model given: prompts are not tokenised, so only token-id prompts are routed "
              "by their cached prefix", file=sys.stderr)
    return run_router(router, a.host, a.port, admin_key=a.admin_key, log_level=a.log_level)
