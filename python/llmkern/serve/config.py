"""ServeConfig: the HTTP front's settings (the engine's own are EngineConfig), validated up front,
and the command-line options that fill it."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from typing import List, Optional

from .kv_events_config import KVEventsConfig, kv_events_arg


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"                  # loopback unless asked: no accidental exposure
    port: int = 8000
    served_model_name: Optional[str] = None  # default: the model's file or directory name
    api_key: Optional[str] = None            # required as "Authorization: Bearer KEY" when set
    # admission
    max_queued_requests: Optional[int] = None   # requests waiting to start; 429 beyond
    max_queued_tokens: Optional[int] = None     # prompt tokens waiting to be prefilled; 429 beyond
    queue_timeout_s: Optional[float] = None     # a request not started by then fails (503)
    slo_ttft_ms: Optional[float] = None         # refuse what the predicted TTFT says will miss it
    # limits
    max_body_bytes: int = 2 << 20
    max_n: int = 16
    max_tokens_limit: Optional[int] = None      # default: the model's context length
    cors_origins: Optional[List[str]] = None    # CORS off unless origins are given
    shutdown_grace_s: float = 30.0              # in-flight requests get this long on SIGTERM
    kv_events_config: Optional[KVEventsConfig] = None   # vLLM-format KV events over ZMQ when active

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            bad("port", "an integer in [0, 65535]")
        for name in ("max_queued_requests", "max_queued_tokens", "max_tokens_limit"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                bad(name, "an integer >= 0 or None")
        for name in ("queue_timeout_s", "slo_ttft_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                bad(name, "a number > 0 or None")
        if self.max_body_bytes < 1024:
            bad("max_body_bytes", "at least 1024")
        if self.max_n < 1:
            bad("max_n", "an integer >= 1")
        if self.shutdown_grace_s < 0:
            bad("shutdown_grace_s", "a number of seconds >= 0")
        if self.api_key == "":
            self.api_key = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "ServeConfig":
        names = {f.name for f in fields(cls)}
        kv = getattr(a, "kv_events_config", None)
        if kv is not None and kv.active and ((getattr(a, "data_parallel_size", 1) or 1) > 1 or getattr(a, "pd", None)):
            # the replicas would all bind one endpoint: start them by hand, an endpoint each
            raise ValueError("--kv-events-config: not with --data-parallel-size > 1 or --pd (start the "
                             "replicas separately, each with its own endpoint)")
        return cls(**{k: v for k, v in vars(a).items() if k in names})


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None, help="the name clients pass as 'model'")
    g.add_argument("--api-key", default=os.environ.get("LLMKERN_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                        "(default: $LLMKERN_API_KEY)")
    g.add_argument("--cors-origins", nargs="*", default=None, help="allow these origins (default: CORS off)")
    g.add_argument("--max-body-bytes", type=int, default=2 << 20)
    g.add_argument("--max-n", type=int, default=16)
    g.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens accepted (default: context)")
    g.add_argument("--shutdown-grace-s", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, how long in-flight requests may run before they are aborted")
    g.add_argument("--kv-events-config", type=kv_events_arg, default=None, metavar="JSON",
                   help="publish prefix-cache events in vLLM's format over ZMQ, configured as vLLM's flag, e.g. "
                        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
                        '"replay_endpoint": "tcp://*:5558", "topic": "kv"}\'')
    g.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    a = p.add_argument_group("batching and admission")
    a.add_argument("--policy", default="fcfs", choices=["fcfs", "priority"],
                   help="queue order; priority: the request's 'priority' field (lower first), and the "
                        "lowest-priority running request is preempted first")
    a.add_argument("--max-batch-size", type=int, default=None,
                   help="static/dynamic: sequences per batch (sets --max-num-seqs)")
    a.add_argument("--max-wait-ms", type=float, default=50.0,
                   help="dynamic: the longest the oldest request waits for a full batch")
    a.add_argument("--decode-defer-steps", type=int, default=1,
                   help="a step that completes a prompt runs without the running decodes, at most this many "
                        "steps in a row (a new request's first token then waits only for its prefill); 0: mix "
                        "them into every step, as vLLM does (default 1: measured better TTFT and TPOT here)")
    a.add_argument("--no-kv-prefault", dest="kv_prefault", action="store_false",
                   help="leave the CPU KV cache's pages to be faulted in at first use, on requests' critical "
                        "path (default: faulted in before the server answers /health)")
    a.add_argument("--max-queued-requests", type=int, default=None, help="429 beyond this many waiting requests")
    a.add_argument("--max-queued-tokens", type=int, default=None, help="429 beyond this many waiting prompt tokens")
    a.add_argument("--queue-timeout-s", type=float, default=None, help="fail requests not started by then (503)")
    a.add_argument("--slo-ttft-ms", type=float, default=None,
                   help="refuse (429) requests whose TTFT, predicted from the prefill work ahead and the "
                        "measured prefill rate, would exceed this")
