"""`llmkern serve --pd NPMD` (e.g. 1P1D): N prefill and M decode replicas of `llmkern serve` on
loopback ports, each pinned to its share of the CPUs (llmkern's cpu_share rule, like
--data-parallel-size) or its own GPU, supervised like them (a replica that exits is restarted on
its port), and the router in --pd mode on the public port. The replicas die with the launcher
(stopping it drains them; PDEATHSIG covers a launcher that was killed)."""
from __future__ import annotations

import re
from typing import List, Tuple

from ..procs import free_port

from .launch import _router_tokenizer, replica_argv, run_router, supervised

_SPEC = re.compile(r"^(\d+)P(\d+)D$", re.IGNORECASE)
# Options the launcher decides for each replica (besides those of data parallelism).
_LAUNCHER_OPTS = ("--pd", "--role", "--kv-connector", "--kv-rendezvous", "--kv-rank", "--kv-world-size")


def parse_pd_spec(spec: str) -> Tuple[int, int]:
    """'1P1D' -> (1, 1): prefill and decode replica counts."""
    m = _SPEC.match(spec or "")
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"--pd: expected NPMD with N, M >= 1 (e.g. 1P1D, 2P1D), got {spec!r}")
    return int(m.group(1)), int(m.group(2))


def _strip(argv: List[str], names) -> List[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in names:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def pd_replica_argv(argv: List[str], role: str, index: int, extra: List[str]) -> List[str]:
    """One replica's serve arguments: the user's, less the launcher's own, plus its role."""
    return _strip(replica_argv(argv), _LAUNCHER_OPTS) + ["--role", role] + extra


def run_pd(a, argv: List[str]) -> int:
    from .pd import PDRouter

    n_prefill, n_decode = parse_pd_spec(a.pd)
    use_gpus = False
    if a.device != "cpu":
        try:
            import torch

            use_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= n_prefill + n_decode
        except ImportError:
            pass
    tokenizer = _router_tokenizer(a.model, a.load_format)
    connector_argv = launch_connector_argv(a)
    roles = ["prefill"] * n_prefill + ["decode"] * n_decode
    sup = supervised([pd_replica_argv(argv, role, i, connector_argv(role, i)) for i, role in enumerate(roles)],
                     use_gpus)
    try:
        urls = list(sup.replicas)
        router = PDRouter(urls[:n_prefill], urls[n_prefill:], policy=a.router_policy, tokenizer=tokenizer)
        return run_router(router, a.host, a.port, log_level=a.log_level, grace_s=a.shutdown_grace_s, supervisor=sup)
    finally:
        sup.stop_all(a.shutdown_grace_s + 5)


def launch_connector_argv(a):
    """For `serve --pd`: each replica's connector options (one rendezvous on a free loopback port,
    ranks in launch order: prefill replicas first)."""
    n_prefill, n_decode = parse_pd_spec(a.pd)
    rendezvous = a.kv_rendezvous or f"127.0.0.1:{free_port()}"
    connector = a.kv_connector or "torch"

    def argv(role: str, index: int) -> List[str]:
        return ["--kv-connector", connector, "--kv-rendezvous", rendezvous, "--kv-rank", str(index),
                "--kv-world-size", str(n_prefill + n_decode)]
    return argv
