"""`llmkern serve --pd NPMD` (e.g. 1P1D): N prefill and M decode replicas of `llmkern serve` on
loopback ports, each pinned to its share of the CPUs (llmkern's cpu_share rule, like
--data-parallel-size) or its own GPU, supervised like them (a replica that exits is restarted on
its port), and the router in --pd mode on the public port. The replicas die with the launcher
(stopping it drains them; PDEATHSIG covers a launcher that was killed).

The launcher itself hosts the KV connectors' rendezvous store (it never runs an engine, so the
store outlives any replica) and every replica connects to it; a restarted replica rejoins under
its rank as a new incarnation (pd/pull.py), with either connector."""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

from ..procs import free_port

from .launch import _router_tokenizer, replica_argv, run_router, supervised

_SPEC = re.compile(r"^(\d+)P(\d+)D$", re.IGNORECASE)
# Options the launcher decides for each replica (besides those of data parallelism).
_LAUNCHER_OPTS = ("--pd", "--role", "--kv-connector", "--kv-rendezvous", "--kv-rank", "--kv-world-size",
                  "--kv-rendezvous-external")


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
    store = host_store(a.kv_rendezvous)
    connector_argv = launch_connector_argv(a, store.port)
    roles = ["prefill"] * n_prefill + ["decode"] * n_decode
    sup = supervised([pd_replica_argv(argv, role, i, connector_argv(role, i)) for i, role in enumerate(roles)],
                     use_gpus)
    try:
        urls = list(sup.replicas)
        router = PDRouter(urls[:n_prefill], urls[n_prefill:], policy=a.router_policy, tokenizer=tokenizer)
        return run_router(router, a.host, a.port, log_level=a.log_level, grace_s=a.shutdown_grace_s, supervisor=sup)
    finally:
        sup.stop_all(a.shutdown_grace_s + 5)


def host_store(rendezvous: Optional[str]):
    """The connectors' TCPStore, hosted by this process: on --kv-rendezvous HOST:PORT if given,
    else on a free loopback port (store.port)."""
    from datetime import timedelta

    import torch.distributed as dist

    from ..pd.pull import STORE_TIMEOUT_S

    host, port = "127.0.0.1", 0
    if rendezvous:
        host, _, p = rendezvous.rpartition(":")
        if not host or not p.isdigit():
            raise ValueError(f"--kv-rendezvous: expected HOST:PORT, got {rendezvous!r}")
        port = int(p)
    return dist.TCPStore(host, port, None, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=STORE_TIMEOUT_S))


def launch_connector_argv(a, store_port: Optional[int] = None):
    """For `serve --pd`: each replica's connector options (ranks in launch order: prefill replicas
    first). store_port: the launcher hosts the store there (replicas connect, rank 0 included);
    without it rank 0 hosts it on --kv-rendezvous or a free loopback port."""
    n_prefill, n_decode = parse_pd_spec(a.pd)
    if store_port is not None:
        host = a.kv_rendezvous.rpartition(":")[0] if a.kv_rendezvous else "127.0.0.1"
        rendezvous, external = f"{host}:{store_port}", ["--kv-rendezvous-external"]
    else:
        rendezvous, external = a.kv_rendezvous or f"127.0.0.1:{free_port()}", []
    connector = a.kv_connector or "torch"

    def argv(role: str, index: int) -> List[str]:
        return ["--kv-connector", connector, "--kv-rendezvous", rendezvous, "--kv-rank", str(index),
                "--kv-world-size", str(n_prefill + n_decode), *external]
    return argv
