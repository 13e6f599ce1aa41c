"""Process entry points: run_router (uvicorn over the router app; SIGTERM drains it) and the
data-parallel launcher behind `llmkern serve --data-parallel-size N`: N `llmkern serve` replicas on
loopback ports, each pinned to its share of the CPUs (or its own GPU), supervised (a replica that
exits is restarted on its port), and the router on the public port. The replicas die with the
launcher (stopping it drains them; PDEATHSIG covers a launcher that was killed)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

from ..procs import child_setup, free_port, stop


def run_router(router, host: str, port: int, admin_key: Optional[str] = None, log_level: str = "warning",
               grace_s: float = 30.0, supervisor=None) -> int:
    """Serve until SIGTERM/SIGINT, then drain: the socket stays open and new requests get 503 with
    Retry-After while those in flight finish (for up to grace_s); exit 0. A second signal ends it
    at once. supervisor: the launcher's ReplicaSupervisor, started with the app."""
    import uvicorn

    from ..serve.server import _DrainingServer, freeze_gc_heap
    from .app import build_router_app

    app = build_router_app(router, admin_key, supervisor=supervisor, grace_s=grace_s)
    print(f"llmkern router: {len(router.workers)} worker(s), policy {router.policy.name}, on http://{host}:{port}/v1",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, timeout_keep_alive=5,
                            timeout_graceful_shutdown=5)
    freeze_gc_heap()   # the router relays every token: a full collection would stall all streams
    _DrainingServer(config, app.state.drain).run()
    return 0


def split_cpus(n: int) -> List[List[int]]:
    """The CPUs this process may use, in n contiguous shares (llmkern's own cpu_share rule)."""
    from ..cpu_affinity import cpu_share

    return [cpu_share(i, n) for i in range(n)]


def replica_argv(argv: List[str]) -> List[str]:
    """The serve arguments without those the launcher decides (data parallelism, router, address)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in ("--data-parallel-size", "--router-policy", "--host", "--port"):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def spawn_replica(serve_argv: List[str], index: int, shares, use_gpus: bool = False, port: Optional[int] = None):
    """(Popen, url) of one `llmkern serve` replica on a loopback port (a free one unless given): GPU
    `index`, or the CPUs shares[index] (the replica pins itself to them and sizes its threads)."""
    from ..cpu_affinity import format_cpus

    port = port or free_port()
    env = dict(os.environ)
    cpus = None
    if use_gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(index)
    else:
        cpus = shares[index]
        env["OMP_NUM_THREADS"] = str(len(cpus))
        env["LLMKERN_CPUS"] = format_cpus(cpus)
    cmd = [sys.executable, "-m", "llmkern.cli", "serve", *serve_argv, "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(cmd, env=env, preexec_fn=child_setup(cpus)), f"http://127.0.0.1:{port}"


def supervised(argvs: List[List[str]], use_gpus: bool = False):
    """A ReplicaSupervisor of one replica per serve argv (started now, on free loopback ports); each
    is started again with the same argv, CPUs or GPU and port when it exits."""
    from .supervisor import Replica, ReplicaSupervisor

    shares = split_cpus(len(argvs))
    reps = []
    try:
        for i, argv in enumerate(argvs):
            p, url = spawn_replica(argv, i, shares, use_gpus)
            port = int(url.rsplit(":", 1)[1])
            reps.append(Replica(url, lambda argv=argv, i=i, port=port: spawn_replica(argv, i, shares, use_gpus,
                                                                                     port)[0], p))
    except BaseException:
        stop([r.proc for r in reps], 5)
        raise
    return ReplicaSupervisor(reps)


def stop_replicas(procs, grace_s: float = 30.0) -> None:
    """Stop [(Popen, url)] replicas: SIGTERM (they drain), SIGKILL after grace_s."""
    stop([p for p, _ in procs], grace_s)


def run_data_parallel(a, argv: List[str]) -> int:
    from .core import Router

    use_gpus = False
    if a.device != "cpu":
        try:
            import torch

            use_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= a.data_parallel_size
        except ImportError:
            pass
    tokenizer = _router_tokenizer(a.model, a.load_format)
    sup = supervised([replica_argv(argv)] * a.data_parallel_size, use_gpus)
    try:
        router = Router(list(sup.replicas), policy=a.router_policy, tokenizer=tokenizer)
        return run_router(router, a.host, a.port, log_level=a.log_level, grace_s=a.shutdown_grace_s, supervisor=sup)
    finally:
        sup.stop_all(a.shutdown_grace_s + 5)


def _router_tokenizer(model: Optional[str], load_format: str = "auto"):
    if load_format == "dummy":
        return None
    from ..models.loader import load_tokenizer

    return load_tokenizer(model)
