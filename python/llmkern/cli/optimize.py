"""`llmkern optimize` (configuration sweeps) and `llmkern estimate` (the calibrated performance
estimate): the tools' own add_args/run live in llmkern.optimize.cli; this maps their errors."""
from __future__ import annotations

from ..optimize.cli import add_estimate_args, add_optimize_args  # noqa: F401  (the commands' options)
from .common import fail

OPTIMIZE_HELP = ("sweep server configurations on a workload under latency constraints (results in an SQLite runs "
                 "database)")
ESTIMATE_HELP = ("predicted step times, TTFT/ITL/throughput and limits for a model on a hardware profile "
                 "(--calibrate measures this machine)")


def run_optimize(a) -> int:
    from ..optimize.cli import run_optimize as run
    from ..optimize.db import SchemaError

    try:
        return run(a)
    except (ValueError, SchemaError, FileNotFoundError) as e:
        raise fail(f"optimize: {e}")


def run_estimate(a) -> int:
    from ..optimize.cli import run_estimate as run

    try:
        return run(a)
    except (ValueError, FileNotFoundError) as e:
        raise fail(f"estimate: {e}")
