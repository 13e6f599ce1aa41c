"""Prefill-decode disaggregation: what a prefill engine hands to a decode engine, and the connector
interface that moves KV blocks between them (the engine's side is engine/kv_handover.py).

Roles (EngineConfig.kv_role):
- "both" (default): today's engine, no connector.
- "prefill": every request runs its prompt and samples its first token (max_tokens is forced to
  1, n must be 1); when it finishes, its KV blocks are *pinned* (neither freed nor evictable),
  the connector is told (KVConnector.request_finished) and the request's RequestOutput carries
  `kv_transfer_params` (a JSON-ready dict, KVTransferParams.to_dict()). The blocks stay pinned
  until the connector reports the send finished (done or failed), the request is aborted, or
  the params' deadline passes; then they are released (they stay in the prefix cache).
- "decode": a request added with `kv_transfer_params` (the prefill side's dict) allocates its
  blocks first (blocks it already holds for the prompt's prefix are reused, not received), asks
  the connector to fill the rest (KVConnector.start_load), and waits in a "waiting for KV" state
  with a deadline. When the connector reports it done, the received blocks were already checked
  (block hashes, byte size) and copied in by the connector; the request then decodes from the
  first token on: its output is the *whole* completion, first token included, as a co-located
  engine would have produced it. Requests without params run normally (prefill + decode).
  On failure (deadline, prefill peer gone, bad data) the request's blocks are freed and it either
  finishes with finish_reason "error" and RequestOutput.error set, or, with
  EngineConfig.kv_transfer_fallback="recompute", is recomputed on this engine (co-located retry).

Threading contract (what makes "never a read of freed blocks" hold): the engine calls every
method on its own thread. A connector reads the engine's KV cache only inside
request_finished(), save_kv_layer() and poll(), and writes it only inside poll() (and
load_kv_layer()), and never for a request after abort() returned for it. Anything it does in
the background works on its own staging buffers.

Byte accounting: a transfer of b blocks moves exactly b * block_bytes KV bytes, where block_bytes
= 2 (K and V) * num_layers * block_size * num_kv_heads * head_dim * element size (all layers of
the cache, draft layers included). Engine.stats() sums them; RequestMetrics carries each
request's bytes and transfer seconds.
"""
from __future__ import annotations

import enum
import json
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

from ..kvcache.blocks import kv_cache_geometry

KV_ROLES = ("both", "prefill", "decode")
PARAMS_VERSION = 1


class TransferState(str, enum.Enum):
    """Where one request's hand-over stands, as KVConnector.poll reports it."""
    PENDING = "pending"            # registered, nothing moved yet (e.g. waiting for the peer's pull)
    TRANSFERRING = "transferring"  # bytes are moving
    DONE = "done"                  # send: the peer has its copy; recv: blocks filled and verified
    FAILED = "failed"              # see TransferEvent.error; the engine frees the blocks


@dataclass
class KVTransferParams:
    """What a prefill engine returns for a finished request and a decode engine needs to take it
    over. JSON-serialisable (to_dict / from_dict) so it can travel in an HTTP response.

    engine_id:      the prefill engine's connector id (KVConnector.engine_id); a decode engine
                    accepts only ids its own connector can reach (KVConnector.can_reach).
    engine_rank:    the prefill engine's rank in the connectors' group (point-to-point source).
    request_id:     the request's id on the prefill engine (the key its pinned blocks are under).
    prompt_token_ids: the prompt whose KV is held; the decode side's prompt must equal it.
    num_tokens:     tokens whose KV is held (= len(prompt_token_ids)); its blocks are
                    ceil(num_tokens / block_size), the last one possibly partial.
    block_hashes:   chained hashes (block_pool.block_hash) of the prompt's full blocks.
    block_size, kv_block_bytes, kv_dtype: the cache geometry; a decode engine refuses params whose
                    geometry differs from its own.
    first_token:    the token the prefill engine sampled; the decode side emits it first.
    first_token_logprobs: [logprob, [[id, logprob], ...]] when the request asked for logprobs.
    expires_at:     wall-clock (time.time()) deadline: the prefill engine releases the pinned
                    blocks then, and the decode side gives up waiting by then at the latest.
    """
    engine_id: str
    engine_rank: int
    request_id: str
    prompt_token_ids: List[int]
    num_tokens: int
    block_hashes: List[int]
    block_size: int
    kv_block_bytes: int
    kv_dtype: str
    first_token: int
    expires_at: float
    first_token_logprobs: Optional[list] = None
    version: int = PARAMS_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d) -> "KVTransferParams":
        """Parse and check the prefill side's dict; a ValueError names what is wrong."""
        if isinstance(d, KVTransferParams):
            return d
        if isinstance(d, str):
            try:
                d = json.loads(d)
            except ValueError:
                raise ValueError("kv_transfer_params: not valid JSON") from None
        if not isinstance(d, dict):
            raise ValueError(f"kv_transfer_params: expected a dict, got {type(d).__name__}")
        names = [f for f in cls.__dataclass_fields__]
        required = [n for n in names if n not in ("first_token_logprobs", "version")]
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"kv_transfer_params: missing {', '.join(missing)}")
        if d.get("version", PARAMS_VERSION) != PARAMS_VERSION:
            raise ValueError(f"kv_transfer_params: version {d.get('version')!r}, this engine reads {PARAMS_VERSION}")

        def ints(name, lo=None):
            v = d[name]
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError(f"kv_transfer_params: {name} must be a list of integers")
            if lo is not None and any(x < lo for x in v):
                raise ValueError(f"kv_transfer_params: {name} has values below {lo}")
            return v

        def integer(name, lo):
            v = d[name]
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"kv_transfer_params: {name} must be an integer >= {lo}, got {v!r}")
            return v

        p = cls(engine_id=str(d["engine_id"]), engine_rank=integer("engine_rank", 0),
                request_id=str(d["request_id"]), prompt_token_ids=ints("prompt_token_ids", 0),
                num_tokens=integer("num_tokens", 1), block_hashes=ints("block_hashes"),
                block_size=integer("block_size", 1), kv_block_bytes=integer("kv_block_bytes", 1),
                kv_dtype=str(d["kv_dtype"]), first_token=integer("first_token", 0),
                expires_at=d["expires_at"], first_token_logprobs=d.get("first_token_logprobs"))
        if not isinstance(p.expires_at, (int, float)) or isinstance(p.expires_at, bool):
            raise ValueError("kv_transfer_params: expires_at must be a time.time() value")
        if p.num_tokens != len(p.prompt_token_ids):
            raise ValueError(f"kv_transfer_params: num_tokens {p.num_tokens} != {len(p.prompt_token_ids)} prompt tokens")
        if len(p.block_hashes) != p.num_tokens // p.block_size:
            raise ValueError(f"kv_transfer_params: {len(p.block_hashes)} block hashes for {p.num_tokens} tokens "
                             f"in blocks of {p.block_size}")
        return p

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_size)


@dataclass
class SendRequest:
    """Prefill side: a finished request whose blocks are pinned for its hand-over."""
    request_id: str
    block_ids: List[int]           # ceil(num_tokens / block_size) blocks, in order
    block_hashes: List[int]        # hashes of the full ones
    num_tokens: int
    deadline: float                # time.time(): after it the engine releases the blocks anyway


@dataclass
class LoadRequest:
    """Decode side: blocks allocated for a request, of which the connector fills the tail.

    block_ids[:num_local_blocks] already hold the prefix (this engine's prefix cache); the
    connector fills block_ids[num_local_blocks:] from the peer (blocks num_local_blocks.. of the
    prefill side's request) and checks them against params.block_hashes and the byte size."""
    request_id: str                # the decode engine's id of the request
    params: KVTransferParams
    block_ids: List[int]
    num_local_blocks: int
    deadline: float                # time.time()

    @property
    def num_remote_blocks(self) -> int:
        return len(self.block_ids) - self.num_local_blocks


@dataclass
class TransferEvent:
    """One request's hand-over reached a final state (or progressed), reported by poll()."""
    request_id: str
    direction: str                 # "send" (prefill side) | "recv" (decode side)
    state: TransferState
    nbytes: int = 0                # KV bytes moved for it
    seconds: float = 0.0           # from start (pull / start_load) to completion
    error: Optional[str] = None


class KVConnector(ABC):
    """Moves KV blocks of finished prefills to decode engines. One per engine; implementations in
    llmkern.pd (pull.py: the protocol; p2p.py: torch.distributed point-to-point; shm.py: same-host shared
    memory; factory.build_connector: one from a plain spec).

    Life: the engine calls bind() once (after its cache exists), then on every step poll();
    close() at shutdown. A connector never frees or allocates engine blocks: the engine does, on
    the events poll() returns and on its own deadlines."""

    role: str = "both"

    @property
    @abstractmethod
    def engine_id(self) -> str:
        """This engine's id as a peer sees it (goes into KVTransferParams.engine_id)."""

    @property
    def engine_rank(self) -> int:
        return 0

    def bind(self, role: str, caches, block_size: int) -> None:
        """Attach to the engine's paged cache (list of per-layer (key, value) caches)."""
        self.role = role
        self.caches = caches
        self.block_size = block_size
        self.block_bytes, self.kv_dtype = kv_cache_geometry(caches)

    def can_reach(self, params: KVTransferParams) -> Optional[str]:
        """None if this connector can load from params.engine_id, else the reason it cannot."""
        return None

    # -- prefill side -----------------------------------------------------------------------------
    @abstractmethod
    def request_finished(self, req: SendRequest) -> None:
        """A prefill finished; its blocks are pinned until poll() reports the send DONE or FAILED
        (or abort(), or req.deadline). The connector may send now or when the peer pulls."""

    def save_kv_layer(self, layer: int, requests: List[SendRequest]) -> None:
        """Optional per-layer hook: layer `layer`'s KV of `requests` is final in the cache (for a
        connector that pushes layer by layer while later layers compute). Not called yet: the
        engine hands requests over whole (request_finished), which is what both connectors in
        llmkern.pd need, since they send when the decode side pulls."""

    # -- decode side ------------------------------------------------------------------------------
    @abstractmethod
    def start_load(self, req: LoadRequest) -> None:
        """Fill req.block_ids[req.num_local_blocks:] from the prefill engine named in req.params;
        the blocks are the engine's and stay allocated until poll() reports DONE/FAILED or
        abort(). Raise nothing for a transfer problem: report FAILED from poll()."""

    def load_kv_layer(self, layer: int) -> None:
        """Optional per-layer hook before layer `layer` runs (layer-wise loading). Not called yet:
        a request is scheduled only once all its KV is in place."""

    # -- both -------------------------------------------------------------------------------------
    @abstractmethod
    def poll(self) -> List[TransferEvent]:
        """Progress the transfers; the events of requests that finished (DONE / FAILED) since
        the last call. Called on the engine thread every step; must not block."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Forget a request (send or recv): from now on its blocks are not touched; the engine
        frees or unpins them right after."""

    def has_pending(self) -> bool:
        """Whether background work (e.g. a peer's pull still to serve) needs poll() calls."""
        return False

    def close(self) -> None:
        """Release processes, groups and shared memory (idempotent)."""


@dataclass
class TransferStats:
    """Engine-wide counters of KV hand-overs (Engine.stats() reports them)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds_sent: float = 0.0
    seconds_received: float = 0.0
    sends_done: int = 0
    sends_failed: int = 0
    recvs_done: int = 0
    recvs_failed: int = 0
    per_request: List[Tuple[str, str, int, float]] = field(default_factory=list)  # (id, dir, bytes, s), last 1000

    def record(self, ev: TransferEvent) -> None:
        ok = ev.state is TransferState.DONE
        if ev.direction == "send":
            self.bytes_sent += ev.nbytes
            self.seconds_sent += ev.seconds
            self.sends_done += ok
            self.sends_failed += not ok
        else:
            self.bytes_received += ev.nbytes
            self.seconds_received += ev.seconds
            self.recvs_done += ok
            self.recvs_failed += not ok
        if ok:
            self.per_request.append((ev.request_id, ev.direction, ev.nbytes, ev.seconds))
            del self.per_request[:-1000]


def now() -> float:
    """The clock of transfer deadlines: wall time, comparable across processes on one host."""
    return time.time()
