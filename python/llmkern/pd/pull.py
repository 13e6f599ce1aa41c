"""The pull protocol both KV connectors (p2p.py, shm.py) share (the interface is pd/interface.py).

Every engine of a prefill-decode group has a rank; a torch.distributed TCPStore (hosted by rank 0,
or by a process that outlives the engines: `serve --pd`'s launcher) carries the control messages.
Each engine process is an *incarnation* of its rank: bind() draws a new number from the store
(`inc/<rank>`, counting up) and publishes its pid, so a restarted engine rejoins under its old
rank and its peers tell it from the one that died. The decode side pulls: for each request it
writes `pull/<prefill>.<inc>/<decode>.<inc>/<seq>` = {prefill request id, first block, number of
blocks}, numbering its pulls per pair of incarnations; the prefill side serves one pair's pulls
strictly in that order, so both ends agree on the order of the payloads without any extra
matching. A pull for a request the prefill side no longer holds (unknown, aborted, expired) is
answered with a failure, in order, never left unanswered. When a peer's incarnation changes, what
was in flight with the old one fails at once (the decode side fails its loads; the prefill side
drops the old incarnation's pulls and releases their blocks) and the new one starts afresh.

What travels for a pull: a status, the block hashes of the full blocks sent, and the blocks'
bytes (kvcache.blocks.gather_blocks layout). The decode side checks both against what it expects
before anything is written into its cache, and writes only on the engine thread (poll)."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..kvcache.blocks import scatter_blocks
from .interface import KVConnector, KVTransferParams, LoadRequest, SendRequest, TransferEvent, TransferState, now

_ENGINE_ID = re.compile(r"^(.*)/(\d+)\.(\d+)$")   # <group id>/<rank>.<incarnation>
LIVENESS_S = 0.05   # how often peers' incarnations (and, same host, processes) are checked
NO_KV = "the prefill engine no longer holds this request's KV (unknown id, aborted or expired)"
STORE_TIMEOUT_S = 30.0


Link = Tuple[int, int]   # (peer rank, peer incarnation)


@dataclass
class _Load:
    req: LoadRequest
    peer: Link
    seq: int
    t0: float
    aborted: bool = False


@dataclass
class _Inflight:
    t0: float
    nbytes: int
    aborted: bool = False


class PullConnector(KVConnector):
    """The pull protocol over a TCPStore; subclasses move the bytes (_send, _begin_recv, _progress)."""
    kind = "?"

    def __init__(self, store, rank: int, world_size: int, group: str, timeout_s: float):
        self.base_store = store
        self.store = dist.PrefixStore(f"llmkern/pd/{group}/", store)
        self.rank, self.world_size, self.group = rank, world_size, group
        self.timeout_s = timeout_s
        self._group_id = f"{self.kind}:{group}@{_store_addr(store)}"
        self.sends: Dict[str, SendRequest] = {}      # prefill: pinned, not pulled yet
        self.inflight: Dict[str, _Inflight] = {}     # prefill: pulled, bytes on their way
        self.loads: Dict[str, _Load] = {}            # decode: pulls posted, not complete
        self.dropped: Dict[str, float] = {}          # prefill: aborted sends -> their deadline
        self._pull_in: Dict[Link, int] = {}          # prefill: next pull number per decode incarnation
        self._pull_out: Dict[Link, int] = {}         # decode: next pull number per prefill incarnation
        self.broken: Dict[Link, str] = {}            # peer incarnations that failed: reason
        self.inc = 0                                 # this engine's incarnation (bind)
        self._incs: Dict[int, int] = {}              # peer rank -> its latest incarnation (0: none yet)
        self._incs_at = 0.0
        self._seen: Dict[int, int] = {}              # prefill: decode rank -> incarnation served last
        self._events: List[TransferEvent] = []
        self._closed = False

    # -- identity ---------------------------------------------------------------------------------
    @property
    def engine_id(self) -> str:
        return f"{self._group_id}/{self.rank}.{self.inc}"

    @property
    def engine_rank(self) -> int:
        return self.rank

    @property
    def store_port(self) -> Optional[int]:
        return getattr(self.base_store, "port", None)

    def bind(self, role: str, caches, block_size: int) -> None:
        super().bind(role, caches, block_size)
        self.inc = int(self.store.add(f"inc/{self.rank}", 1))
        self.store.set(f"pid/{self.rank}.{self.inc}", str(os.getpid()))

    def can_reach(self, p: KVTransferParams) -> Optional[str]:
        m = _ENGINE_ID.match(p.engine_id)
        if m is None or m.group(1) != self._group_id:
            return f"this engine's connector is {self._group_id!r}"
        if m.group(2) != str(p.engine_rank) or not 0 <= p.engine_rank < self.world_size or p.engine_rank == self.rank:
            return f"engine_rank {p.engine_rank} is not another rank of {self.world_size}"
        return None

    # -- incarnations -----------------------------------------------------------------------------
    def _current(self, peer: int, fresh: bool = False) -> int:
        """The peer's latest incarnation (0: it never bound), read from the store at most every
        LIVENESS_S unless fresh."""
        t = time.monotonic()
        if fresh or t - self._incs_at > LIVENESS_S:
            if not fresh:
                self._incs_at = t
                peers = [r for r in range(self.world_size) if r != self.rank]
            else:
                peers = [peer]
            for r in peers:
                self._incs[r] = int(self.store.add(f"inc/{r}", 0))
        return self._incs.get(peer, 0)

    def _gone(self, link: Link) -> Optional[str]:
        """Why that incarnation of the peer cannot answer any more, or None (subclasses add what
        else they can see, e.g. a dead process on this host)."""
        peer, inc = link
        if self._current(peer) != inc:
            return f"the engine of rank {peer} restarted (incarnation {inc} is gone)"
        return None

    def _key(self, kind: str, link: Link, seq: int) -> str:
        """The store key of a pull (kind "pull") or its answer ("done") between this engine and link."""
        if self.role == "prefill":
            return f"{kind}/{self.rank}.{self.inc}/{link[0]}.{link[1]}/{seq}"
        return f"{kind}/{link[0]}.{link[1]}/{self.rank}.{self.inc}/{seq}"

    # -- prefill side -----------------------------------------------------------------------------
    def request_finished(self, req: SendRequest) -> None:
        self.sends[req.request_id] = req

    def _serve_pulls(self) -> None:
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            link = (peer, self._current(peer))
            seen = self._seen.get(peer, 0)
            if link[1] != seen:
                # The incarnations since the last one seen are gone (none before it: their pulls were
                # addressed to an earlier incarnation of this rank).
                for inc in range(seen, link[1]) if seen else ():
                    self._forget_decode((peer, inc))
                self._seen[peer] = link[1]
            if not link[1] or link in self.broken:
                continue
            while True:
                n = self._pull_in.get(link, 0)
                key = self._key("pull", link, n)
                if not self.store.check([key]):
                    break
                msg = json.loads(self.store.get(key))
                self.store.delete_key(key)
                self._pull_in[link] = n + 1
                self._serve(link, n, msg)

    def _forget_decode(self, link: Link) -> None:
        """A decode incarnation is gone (its rank restarted): the pulls it posted and we have not
        served are dropped, and their requests' blocks released now (no one will read them)."""
        n = self._pull_in.pop(link, 0)
        while self.store.check([self._key("pull", link, n)]):
            key = self._key("pull", link, n)
            rid = json.loads(self.store.get(key)).get("rid")
            self.store.delete_key(key)
            n += 1
            if self.sends.pop(rid, None) is not None:
                why = f"decode engine rank {link[0]} restarted before it took the KV"
                self._events.append(TransferEvent(rid, "send", TransferState.FAILED, error=why))
        self._decode_gone(link)

    def _decode_gone(self, link: Link) -> None:
        """Hook: forget transport state of a decode incarnation that is gone."""

    def _serve(self, peer: Link, seq: int, msg: dict) -> None:
        rid = msg.get("rid")
        req = self.sends.pop(rid, None)
        first, count = msg.get("first", -1), msg.get("n", -1)
        if req is None or now() > req.deadline:
            return self._send_failure(peer, seq, NO_KV)
        if not (isinstance(first, int) and isinstance(count, int) and 0 <= first
                and first + count <= len(req.block_ids) and count >= 0):
            self._events.append(TransferEvent(rid, "send", TransferState.FAILED,
                                              error=f"bad pull: blocks {first}+{count} of {len(req.block_ids)}"))
            return self._send_failure(peer, seq, "bad block range")
        ids = req.block_ids[first:first + count]
        self.inflight[rid] = _Inflight(time.perf_counter(), len(ids) * self.block_bytes)
        self._send(peer, seq, rid, ids, req.block_hashes[first:first + count])

    def _send_done(self, rid: str, error: Optional[str]) -> None:
        """A transport finished sending rid's bytes (error None) or gave up."""
        f = self.inflight.pop(rid, None)
        if f is None or f.aborted:
            return
        dt = time.perf_counter() - f.t0
        self._events.append(TransferEvent(rid, "send", TransferState.FAILED if error else TransferState.DONE,
                                          0 if error else f.nbytes, dt, error))

    # -- decode side ------------------------------------------------------------------------------
    def start_load(self, req: LoadRequest) -> None:
        p = req.params
        peer = (p.engine_rank, int(_ENGINE_ID.match(p.engine_id).group(3)))
        try:
            self._current(peer[0], fresh=True)
            gone = (f"prefill engine rank {peer[0]} failed earlier: {self.broken[peer]}" if peer in self.broken
                    else self._gone(peer))
            if gone:
                self._events.append(TransferEvent(req.request_id, "recv", TransferState.FAILED, error=gone))
                return
            seq = self._pull_out.get(peer, 0)
            msg = {"rid": p.request_id, "first": req.num_local_blocks, "n": req.num_remote_blocks}
            self.store.set(self._key("pull", peer, seq), json.dumps(msg))
        except Exception as e:  # noqa: BLE001 - the store's host is gone
            self._peer_failed(peer, f"control store unreachable: {_short(e)}")
            self._events.append(TransferEvent(req.request_id, "recv", TransferState.FAILED, error=self.broken[peer]))
            return
        self._pull_out[peer] = seq + 1
        self.loads[req.request_id] = _Load(req, peer, seq, time.perf_counter())
        self._begin_recv(peer, seq, req.request_id)

    def _recv_done(self, rid: str, error: Optional[str], hashes: Optional[List[int]] = None,
                   data: Optional[torch.Tensor] = None) -> None:
        """On the engine thread: check what arrived for rid and write it into the blocks."""
        ld = self.loads.pop(rid, None)
        if ld is None or ld.aborted:
            return
        req, p = ld.req, ld.req.params
        first, n = req.num_local_blocks, req.num_remote_blocks
        dt = time.perf_counter() - ld.t0
        if error is None:
            want = p.block_hashes[first:first + n]
            nbytes = 0 if data is None else data.numel()
            if hashes != want:
                error = "received block hashes differ from the request's (another prompt or model?)"
            elif nbytes != n * self.block_bytes:
                error = f"received {nbytes} KV bytes, expected {n} blocks x {self.block_bytes}"
        if error is not None:
            self._events.append(TransferEvent(rid, "recv", TransferState.FAILED, seconds=dt, error=error))
            return
        if n:
            scatter_blocks(self.caches, req.block_ids[first:], data)
        self._events.append(TransferEvent(rid, "recv", TransferState.DONE, data.numel(), dt))

    # -- both -------------------------------------------------------------------------------------
    def poll(self) -> List[TransferEvent]:
        try:
            if self.role == "prefill":
                self._serve_pulls()
            self._progress()
            t = now()
            for rid, ld in list(self.loads.items()):
                if ld.aborted and t > ld.req.deadline:
                    del self.loads[rid]
            for rid, until in list(self.dropped.items()):
                if t > until:
                    del self.dropped[rid]
        except Exception as e:  # noqa: BLE001 - the control store's host died: nothing more can move
            self._fail_all(f"control store unreachable: {_short(e)}")
        ev, self._events = self._events, []
        return ev

    def abort(self, request_id: str) -> None:
        req = self.sends.pop(request_id, None)
        if req is not None and self.role == "prefill":
            # A decode engine may still pull it: keep polling until its deadline to refuse
            # the pull at once (a pull left unanswered would hold up that peer's later ones).
            self.dropped[request_id] = req.deadline
        if request_id in self.inflight:
            self.inflight[request_id].aborted = True  # bytes are a copy; the pull is still answered
        if request_id in self.loads:
            self.loads[request_id].aborted = True     # its payload is still drained, then dropped

    def has_pending(self) -> bool:
        # An aborted load still has a payload to drain (and, for shared memory, a file to
        # remove), until its deadline: past it, nothing more is expected from the peer.
        return bool(any(not f.aborted for f in self.inflight.values()) or self.loads or self.dropped)

    def pulls_waiting(self) -> int:
        """Prefill side: pulls posted by peers and not served yet (for tests and diagnostics)."""
        n = 0
        for peer in range(self.world_size):
            link = (peer, self._current(peer, fresh=True))
            if peer != self.rank and self.store.check([self._key("pull", link, self._pull_in.get(link, 0))]):
                n += 1
        return n

    def _peer_failed(self, peer: Link, why: str) -> None:
        self.broken.setdefault(peer, why)

    def _fail_all(self, why: str) -> None:
        for peer in range(self.world_size):
            if peer != self.rank:
                self._peer_failed((peer, self._incs.get(peer, 0)), why)
        for rid in list(self.inflight):
            self._send_done(rid, why)
        for rid in list(self.loads):
            self._recv_done(rid, why)

    def close(self) -> None:
        self._closed = True

    # -- transport --------------------------------------------------------------------------------
    def _send(self, peer: Link, seq: int, rid: str, block_ids: List[int], hashes: List[int]) -> None:
        """Copy the blocks out (on this thread: they are pinned now) and send the copy."""
        raise NotImplementedError

    def _send_failure(self, peer: Link, seq: int, why: str) -> None:
        raise NotImplementedError

    def _begin_recv(self, peer: Link, seq: int, rid: str) -> None:
        raise NotImplementedError

    def _progress(self) -> None:
        raise NotImplementedError


def _store_addr(store) -> str:
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return f"{host}:{port}" if host is not None else f"store{id(store)}"


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:200] if s else ''}"
