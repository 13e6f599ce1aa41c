"""`llmkern serve`: the OpenAI-compatible server; with --data-parallel-size or --pd, replicas
behind a router."""
from __future__ import annotations

from ..serve.command_args import add_serve_command_args as add_args  # noqa: F401  (the command's options)
from .common import SERVE_HINT, check_engine_args, make_llm

HELP = "OpenAI-compatible HTTP server (needs the serve extra)"


def run(a) -> int:
    from ..serve.config import ServeConfig

    try:
        from ..serve.app import default_model_name
        from ..serve.server import run_server
    except ImportError as e:
        raise SystemExit(f"{SERVE_HINT} ({e})")
    if a.max_batch_size is not None:
        a.max_num_seqs = a.max_batch_size
    try:
        cfg = ServeConfig.from_args(a)
    except ValueError as e:
        raise SystemExit(f"llmkern serve: {e}")
    if a.data_parallel_size < 1:
        raise SystemExit(f"llmkern serve: --data-parallel-size: expected an integer >= 1, got {a.data_parallel_size}")
    from ..serve.pd import check_pd_args

    problem = check_pd_args(a)
    if problem:
        raise SystemExit(f"llmkern serve: {problem}")
    if a.pd is not None:
        from ..router.pd_launch import parse_pd_spec, run_pd

        try:
            parse_pd_spec(a.pd)
        except ValueError as e:
            raise SystemExit(f"llmkern serve: {e}")
        check_engine_args(a)
        return run_pd(a, a.argv[1:])
    if a.data_parallel_size > 1:
        from ..router.launch import run_data_parallel

        return run_data_parallel(a, a.argv[1:])
    engine = make_llm(a).engine
    return run_server(engine, cfg, cfg.served_model_name or default_model_name(a.model), a.log_level)
