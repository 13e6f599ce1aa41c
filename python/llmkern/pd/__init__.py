"""Prefill-decode disaggregation: the KV hand-over between a prefill engine and a decode engine.

- interface.py  the roles, KVTransferParams (what a prefill engine's output carries), the
                KVConnector interface and its requests/events, transfer counters
- pull.py       the pull protocol over a torch.distributed TCPStore that both connectors share
- p2p.py        KV blocks over torch.distributed point-to-point (gloo; NCCL for CUDA caches)
- shm.py        KV blocks through shared-memory files between engines on one host
- factory.py    build_connector: a connector from a plain spec (CLI, server, EngineConfig)

The engine's side (pinning, loading, deadlines) is engine/kv_handover.py, which sees only the
interface; the HTTP side is serve/pd.py (roles) and router/pd.py + router/pd_launch.py (routing,
`serve --pd`)."""
from .factory import build_connector
from .interface import KV_ROLES, KVConnector, KVTransferParams, TransferStats

__all__ = ["build_connector", "KV_ROLES", "KVConnector", "KVTransferParams", "TransferStats"]
