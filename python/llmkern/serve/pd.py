"""The server's side of prefill-decode disaggregation (`llmkern serve --role prefill|decode`).

The role is the engine's (EngineConfig.kv_role); this module only says what it means over HTTP:
- prefill: a request (one prompt, not streamed) is validated as a co-located server would, runs
  its prompt and first token, and the response carries a top-level `kv_transfer_params` object
  (KVTransferParams.to_dict()) for a decode server. A `kv_transfer_params` field in the request
  (a router's {"do_remote_decode": true}) is accepted and needs nothing more.
- decode: a request with the prefill server's `kv_transfer_params` receives the prompt's KV
  blocks instead of computing them and streams the whole completion, first token included; a
  request without it runs prefill and decode here (the router's co-located fallback).
- both (default): today's server; `kv_transfer_params` is refused.
Plus the command-line options of the roles and connectors, and of `serve --pd NPMD` (whose launcher
is router/pd_launch.py)."""
from __future__ import annotations

import argparse
from typing import Optional

from .errors import APIError

ROLES = ("both", "prefill", "decode")


def engine_role(engine) -> str:
    return getattr(getattr(engine, "config", None), "kv_role", "both") or "both"


class RoleHooks:
    """What generate() asks of the role: extra arguments for the engine, the response's extra field."""

    def __init__(self, role: str):
        self.role = role

    def submit_kwargs(self, body: dict, req) -> dict:
        params = body.get("kv_transfer_params")
        if self.role == "prefill":
            if req.stream:
                raise APIError(400, "stream: a prefill server answers without streaming (its response carries the "
                                    "request's kv_transfer_params for a decode server)", param="stream")
            if len(req.prompts) != 1:
                raise APIError(400, "prompt: a prefill server takes one prompt per request", param="prompt")
            if params is not None and not isinstance(params, dict):
                raise APIError(400, "kv_transfer_params: expected an object", param="kv_transfer_params")
            return {}
        if params is None:
            return {}
        if self.role == "both":
            raise APIError(400, "kv_transfer_params: this server prefills and decodes itself (--role both); send "
                                "the request without it", param="kv_transfer_params")
        if not isinstance(params, dict) or "engine_id" not in params:
            raise APIError(400, "kv_transfer_params: expected the object a prefill server returned",
                           param="kv_transfer_params")
        return {"kv_transfer_params": params}

    def response(self, resp: dict, outs) -> dict:
        if self.role == "prefill":
            resp["kv_transfer_params"] = getattr(outs[0], "kv_transfer_params", None)
        return resp


# -- command line ---------------------------------------------------------------------------------
def add_pd_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefill-decode disaggregation")
    g.add_argument("--role", default="both", choices=ROLES,
                   help="prefill: run prompts and hand their KV to a decode server; decode: take over requests "
                        "prefilled elsewhere (and run others whole); both: a co-located server")
    g.add_argument("--pd", default=None, metavar="NPMD",
                   help="one machine: N prefill and M decode replicas (e.g. 1P1D) with the CPUs split between "
                        "them (or one GPU each), behind a router in --pd mode on --port")
    g.add_argument("--kv-connector", default=None, choices=["torch", "shm"],
                   help="how KV blocks move between prefill and decode engines: torch.distributed "
                        "point-to-point (gloo on CPU, NCCL on CUDA; several machines) or shared memory (one "
                        "machine) (default with --role/--pd: torch)")
    g.add_argument("--kv-torch-backend", default="gloo", choices=["gloo", "nccl"],
                   help="--kv-connector torch: gloo works everywhere (GPU caches staged through host memory); "
                        "nccl sends GPU to GPU (each engine on its own GPU)")
    g.add_argument("--kv-rendezvous", default=None, metavar="HOST:PORT",
                   help="the connectors' rendezvous address (a torch.distributed TCPStore; with --pd: a free "
                        "loopback port)")
    g.add_argument("--kv-rendezvous-external", action="store_true",
                   help="the rendezvous store is hosted by another process (serve --pd's launcher, so that it "
                        "outlives any replica): rank 0 connects to it instead of hosting it")
    g.add_argument("--kv-rank", type=int, default=None,
                   help="this engine's rank among the connected engines (prefill engines first)")
    g.add_argument("--kv-world-size", type=int, default=None, help="how many engines share the rendezvous")
    g.add_argument("--kv-transfer-timeout-s", type=float, default=30.0,
                   help="a hand-over not complete by then fails: both sides free the blocks")
    g.add_argument("--kv-transfer-fallback", default="recompute", choices=["recompute", "fail"],
                   help="decode role, a hand-over that failed: prefill the request here, or fail it with an error")


def check_pd_args(a) -> Optional[str]:
    """The first problem with the role options, as a message naming the option, or None."""
    if a.pd is not None and a.role != "both":
        return "--role: decided by --pd for each replica; give one or the other"
    if a.pd is not None and getattr(a, "data_parallel_size", 1) > 1:
        return "--pd: cannot be combined with --data-parallel-size"
    if a.kv_transfer_timeout_s is not None and not a.kv_transfer_timeout_s > 0:
        return f"--kv-transfer-timeout-s: expected a number of seconds > 0, got {a.kv_transfer_timeout_s}"
    if a.role == "both" and a.pd is None and (a.kv_connector or a.kv_rendezvous or a.kv_rank is not None):
        return "--kv-connector: only for --role prefill|decode or --pd"
    return None


def engine_kwargs(a) -> dict:
    """EngineConfig arguments of the role (none for a co-located server)."""
    role = getattr(a, "role", "both")
    if role == "both":
        return {}
    return dict(kv_role=role, kv_connector=connector_spec(a), kv_transfer_timeout_s=a.kv_transfer_timeout_s,
                kv_transfer_fallback=a.kv_transfer_fallback)


def connector_spec(a) -> dict:
    """The connector's spec for llmkern.pd.build_connector."""
    if a.kv_rendezvous is None or a.kv_rank is None or a.kv_world_size is None:
        raise ValueError("kv_connector: --role prefill|decode needs --kv-rendezvous HOST:PORT, --kv-rank and "
                         "--kv-world-size (the same rendezvous for every engine; `serve --pd` sets them)")
    host, sep, port = a.kv_rendezvous.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"kv_connector: --kv-rendezvous: expected HOST:PORT, got {a.kv_rendezvous!r}")
    if not 0 <= a.kv_rank < a.kv_world_size:
        raise ValueError(f"kv_connector: --kv-rank: expected 0 <= rank < --kv-world-size ({a.kv_world_size}), "
                         f"got {a.kv_rank}")
    kind = {"torch": "p2p", "shm": "shm"}[a.kv_connector or "torch"]
    spec = {"kind": kind, "rank": a.kv_rank, "world_size": a.kv_world_size, "master_addr": host,
            "master_port": int(port)}
    if getattr(a, "kv_rendezvous_external", False):
        spec["is_master"] = False
    if kind == "p2p":
        spec["backend"] = getattr(a, "kv_torch_backend", "gloo")
    return spec
