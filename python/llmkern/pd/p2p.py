"""KV hand-over over torch.distributed point-to-point: one two-member process group per pair of a
prefill and a decode engine *incarnation* (gloo on CPU; NCCL for CUDA caches when asked), its
rendezvous under `pg/<prefill>.<inc>-<decode>.<inc>/` in the connector's store.

Per pair groups, not one group of all ranks, so that an engine restarted under its old rank (a new
incarnation, see pull.py) rejoins: its peers form a new group with it and never wait for the
others. Each engine runs one link thread per peer rank: it forms the group with the peer's
current incarnation (at once when both are up: bind waits, bounded, for the peers already
registered), forms a new one when the incarnation changes, and runs the blocking sends (prefill
side) or receives (decode side) in the order of the pulls. gloo's send/recv complete only inside
wait(); the engine thread hands the link threads staging copies and takes back what arrived, so
no thread ever touches the engine's cache. A peer that dies ends its pending calls at once (its
sockets close); a hung peer ends them at the group's timeout; either way that incarnation is
marked broken and every later transfer with it fails at once, until the peer restarts.

Per pull, the prefill side sends three messages: a header int64[4] (status 1/0, blocks, bytes,
hashes), the full blocks' hashes (int64), the bytes (uint8)."""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ..kvcache.blocks import gather_blocks
from .pull import LIVENESS_S, NO_KV, STORE_TIMEOUT_S, PullConnector, _short

_TAG = 7
BIND_WAIT_S = 10.0     # at most this long at bind for the peers already up (a dead one is not waited out)
_MAX_PAYLOAD = 1 << 36  # refuse absurd headers (a corrupt stream) instead of allocating them


class P2PConnector(PullConnector):
    kind = "p2p"

    def __init__(self, store, rank: int, world_size: int, group: str, timeout_s: float, backend: str = "gloo"):
        super().__init__(store, rank, world_size, group, timeout_s)
        self.backend = backend
        self._links: Dict[int, "queue.Queue"] = {}
        self._formed: Dict[int, threading.Event] = {}   # set once a link's first group attempt ended
        self._done: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()

    def bind(self, role: str, caches, block_size: int) -> None:
        cuda = caches[0][0].is_cuda
        if self.backend == "nccl" and not cuda:
            raise ValueError("kv_connector: backend 'nccl' needs a CUDA KV cache")
        super().bind(role, caches, block_size)
        self.device = caches[0][0].device if self.backend == "nccl" else torch.device("cpu")
        self.store.set(f"role/{self.rank}.{self.inc}", role)
        for peer in range(self.world_size):
            if peer != self.rank:
                self._link(peer)
        # The peers already up form their groups with this one now: wait for them (bounded), so a
        # server that reports ready can hand over at once. Peers that come later form theirs then.
        end = time.monotonic() + min(self.timeout_s, BIND_WAIT_S)
        for peer, ev in self._formed.items():
            if self._current(peer, fresh=True):
                ev.wait(max(0.0, end - time.monotonic()))

    # -- engine thread side -----------------------------------------------------------------------
    def _link(self, peer: int) -> "queue.Queue":
        q = self._links.get(peer)
        if q is None:
            q = self._links[peer] = queue.Queue()
            self._formed[peer] = threading.Event()
            threading.Thread(target=self._run_link, args=(peer, q), name=f"llmkern-kv-link-{peer}",
                             daemon=True).start()
        return q

    def _send(self, peer, seq, rid, block_ids, hashes) -> None:
        data = gather_blocks(self.caches, block_ids)
        if self.device.type == "cuda":  # the gather ran on the engine's stream: done before NCCL reads
            ev = torch.cuda.Event()
            ev.record()
        else:
            ev = None
        self._link(peer[0]).put(("send", peer[1], rid, data.to(self.device), hashes, ev, len(block_ids)))

    def _send_failure(self, peer, seq, why) -> None:
        self._link(peer[0]).put(("send", peer[1], None, None, None, None, 0))

    def _begin_recv(self, peer, seq, rid) -> None:
        self._link(peer[0]).put(("recv", peer[1], rid))

    def _progress(self) -> None:
        while True:
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                break
            if item[0] == "broken":
                self._peer_failed(item[1], item[2])
            elif item[0] == "send":
                self._send_done(item[1], item[2])
            else:
                _, rid, err, hashes, data = item
                if data is not None and self.device.type == "cuda":
                    data = data.to(self.caches[0][0].device)
                self._recv_done(rid, err, hashes, data)
        # A prefill incarnation that is gone (restarted) will not answer: fail its loads now.
        for rid, ld in list(self.loads.items()):
            why = None if ld.aborted else self.broken.get(ld.peer) or self._gone(ld.peer)
            if why:
                self._peer_failed(ld.peer, why)
                self._recv_done(rid, why)

    def has_pending(self) -> bool:
        return super().has_pending() or not self._done.empty()

    def close(self) -> None:
        self._stop.set()
        super().close()

    # -- link threads: blocking calls only, on staging tensors ------------------------------------
    def _run_link(self, peer: int, q: "queue.Queue") -> None:
        if self.device.type == "cuda":  # a new thread starts on device 0
            torch.cuda.set_device(self.device)
        pg, inc, broken = None, 0, "not connected yet"
        try:
            store = self._own_store()
            while not self._stop.is_set():
                try:
                    item = q.get(timeout=LIVENESS_S)
                except queue.Empty:
                    item = None
                cur = int(store.add(f"inc/{peer}", 0))
                if cur and cur != inc:    # the peer (re)started: a group with its new incarnation
                    pg, inc = None, cur
                    pg, broken = self._form(store, peer, inc)
                    self._formed[peer].set()
                if item is None:
                    continue
                if item[1] != inc:
                    broken_now = f"the engine of rank {peer} restarted (incarnation {item[1]} is gone)"
                elif pg is None:
                    broken_now = broken
                else:
                    broken_now = self._run(pg, peer, item)
                    if broken_now is not None:
                        pg, broken = None, broken_now
                        self._done.put(("broken", (peer, inc), broken_now))
                if broken_now is not None:
                    self._fail(item, broken_now)
        except Exception as e:  # noqa: BLE001 - the store is gone: nothing more can move
            why = f"link to rank {peer} ended: {_short(e)}"
            self._done.put(("broken", (peer, inc), why))
            while True:
                self._fail(q.get(), why)

    def _own_store(self):
        """This thread's connection to the store: a blocking wait (a group's rendezvous) holds a
        client's connection, which must not stall the engine thread's store calls."""
        host, port = getattr(self.base_store, "host", None), getattr(self.base_store, "port", None)
        if host is None:
            return self.store
        client = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=STORE_TIMEOUT_S))
        return dist.PrefixStore(f"llmkern/pd/{self.group}/", client)

    def _form(self, store, peer: int, inc: int):
        """(the group with that incarnation of the peer, None) or (None, why not). Only between a
        prefill and a decode engine: (None, reason) for a peer of the same role."""
        key = f"role/{peer}.{inc}"
        try:
            store.wait([key])      # set right after the peer drew its incarnation
            if store.get(key).decode() == self.role:
                return None, f"rank {peer} is a {self.role} engine too"
        except RuntimeError as e:
            return None, f"rank {peer} (incarnation {inc}) did not say its role: {_short(e)}"
        me = f"{self.rank}.{self.inc}"
        name = f"{me}-{peer}.{inc}" if self.role == "prefill" else f"{peer}.{inc}-{me}"
        pg_store = dist.PrefixStore(f"pg/{name}/", store)
        rank = 0 if self.role == "prefill" else 1
        timeout = timedelta(seconds=self.timeout_s)
        try:
            if self.backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                return dist.ProcessGroupNCCL(pg_store, rank, 2, opts), None
            return dist.ProcessGroupGloo(pg_store, rank, 2, timeout), None
        except RuntimeError as e:
            return None, (f"could not form the {self.backend} group with rank {peer} (incarnation {inc}) "
                          f"within timeout_s={self.timeout_s:g}: {_short(e)}")

    def _fail(self, item, why: str) -> None:
        if item[0] == "send":
            if item[2] is not None:
                self._done.put(("send", item[2], why))
        else:
            self._done.put(("recv", item[2], why, None, None))

    def _sync(self, work) -> None:
        work.wait()
        if self.device.type == "cuda":  # NCCL's wait orders streams; the host must see the bytes
            torch.cuda.current_stream(self.device).synchronize()

    def _run(self, pg, peer: int, item) -> Optional[str]:
        """One send or receive on the pair's group; None, or why the link broke."""
        other = 1 if self.role == "prefill" else 0
        try:
            if item[0] == "send":
                self._send_one(pg, other, *item[2:])
            else:
                self._recv_one(pg, other, item[2])
        except Exception as e:  # noqa: BLE001 - the peer died or hung past the timeout
            return f"{'send to' if item[0] == 'send' else 'receive from'} rank {peer} failed: {_short(e)}"
        return None

    def _send_one(self, pg, other: int, rid, data, hashes, ev, nblocks) -> None:
        if ev is not None:
            ev.synchronize()
        ok = rid is not None
        n = len(hashes) if ok else 0
        nbytes = data.numel() if ok else 0
        self._sync(pg.send([torch.tensor([int(ok), nblocks, nbytes, n], dtype=torch.int64, device=self.device)],
                           other, _TAG))
        if ok:
            if n:
                self._sync(pg.send([torch.tensor(hashes, dtype=torch.int64, device=self.device)], other, _TAG))
            if nbytes:
                self._sync(pg.send([data], other, _TAG))
            self._done.put(("send", rid, None))

    def _recv_one(self, pg, other: int, rid) -> None:
        header = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._sync(pg.recv([header], other, _TAG))
        ok, nblocks, nbytes, nh = header.tolist()
        if not ok:
            self._done.put(("recv", rid, NO_KV, None, None))
            return
        if not (0 <= nh <= nblocks and 0 <= nbytes <= _MAX_PAYLOAD):
            raise RuntimeError(f"corrupt transfer header {header.tolist()}")
        hashes: List[int] = []
        if nh:
            h = torch.empty(nh, dtype=torch.int64, device=self.device)
            self._sync(pg.recv([h], other, _TAG))
            hashes = h.tolist()
        data = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        if nbytes:
            self._sync(pg.recv([data], other, _TAG))
        self._done.put(("recv", rid, None, hashes, data))
