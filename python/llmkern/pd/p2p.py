"""KV hand-over over torch.distributed point-to-point: a process group of the prefill and decode
engines (gloo on CPU; NCCL for CUDA caches when asked), rendezvous through the connector's store.

gloo's send/recv complete only inside wait(), so each peer gets one sender thread (prefill side)
or one receiver thread (decode side) that runs the blocking calls in the order of the pulls; the
engine thread hands them staging copies and takes back what arrived, so no thread ever touches
the engine's cache. A peer that dies ends its pending calls at once (its sockets close); a hung
peer ends them at the group's timeout; either way the peer is marked broken and every later
transfer with it fails at once.

Per pull, the prefill side sends three messages: a header int64[4] (status 1/0, blocks, bytes,
hashes), the full blocks' hashes (int64), the bytes (uint8)."""
from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Dict, List

import torch
import torch.distributed as dist

from ..kvcache.blocks import gather_blocks
from .pull import NO_KV, Link, PullConnector, _short

_TAG = 7
_MAX_PAYLOAD = 1 << 36  # refuse absurd headers (a corrupt stream) instead of allocating them


class P2PConnector(PullConnector):
    kind = "p2p"

    def __init__(self, store, rank: int, world_size: int, group: str, timeout_s: float, backend: str = "gloo"):
        super().__init__(store, rank, world_size, group, timeout_s)
        self.backend = backend
        self.pg = None
        self._queues: Dict[tuple, "queue.Queue"] = {}
        self._threads: List[threading.Thread] = []
        self._done: "queue.Queue" = queue.Queue()

    def bind(self, role: str, caches, block_size: int) -> None:
        super().bind(role, caches, block_size)
        cuda = caches[0][0].is_cuda
        if self.backend == "nccl" and not cuda:
            raise ValueError("kv_connector: backend 'nccl' needs a CUDA KV cache")
        self.device = caches[0][0].device if self.backend == "nccl" else torch.device("cpu")
        # Every rank constructs the group; this returns once all have joined (or fails at the timeout).
        pg_store = dist.PrefixStore(f"llmkern/pd/{self.group}/pg/", self.base_store)
        timeout = timedelta(seconds=self.timeout_s)
        try:
            if self.backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(pg_store, self.rank, self.world_size, opts)
            else:
                self.pg = dist.ProcessGroupGloo(pg_store, self.rank, self.world_size, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"kv_connector: rank {self.rank} of {self.world_size} could not form the "
                               f"{self.backend} group ({self._group_id}) within timeout_s={self.timeout_s:g}: "
                               f"{_short(e)}") from None

    # -- engine thread side -----------------------------------------------------------------------
    def _worker(self, kind: str, peer: Link) -> "queue.Queue":
        q = self._queues.get((kind, peer))
        if q is None:
            q = self._queues[(kind, peer)] = queue.Queue()
            target = self._sender if kind == "send" else self._receiver
            t = threading.Thread(target=target, args=(peer, q), name=f"llmkern-kv-{kind}-{peer[0]}", daemon=True)
            t.start()
            self._threads.append(t)
        return q

    def _send(self, peer, seq, rid, block_ids, hashes) -> None:
        data = gather_blocks(self.caches, block_ids)
        if self.device.type == "cuda":  # the gather ran on the engine's stream: done before NCCL reads
            ev = torch.cuda.Event()
            ev.record()
        else:
            ev = None
        self._worker("send", peer).put((rid, data.to(self.device), hashes, ev, len(block_ids)))

    def _send_failure(self, peer, seq, why) -> None:
        self._worker("send", peer).put((None, None, None, None, 0))

    def _begin_recv(self, peer, seq, rid) -> None:
        self._worker("recv", peer).put(rid)

    def _progress(self) -> None:
        while True:
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                return
            if item[0] == "broken":
                self._peer_failed(item[1], item[2])
            elif item[0] == "send":
                self._send_done(item[1], item[2])
            else:
                _, rid, err, hashes, data = item
                if data is not None and self.device.type == "cuda":
                    data = data.to(self.caches[0][0].device)
                self._recv_done(rid, err, hashes, data)

    def has_pending(self) -> bool:
        return super().has_pending() or not self._done.empty()

    # -- background threads: blocking calls only, on staging tensors ------------------------------
    def _sync(self, work) -> None:
        work.wait()
        if self.device.type == "cuda":  # NCCL's wait orders streams; the host must see the bytes
            torch.cuda.current_stream(self.device).synchronize()

    def _thread_device(self) -> None:
        if self.device.type == "cuda":  # a new thread starts on device 0
            torch.cuda.set_device(self.device)

    def _sender(self, link: Link, q: "queue.Queue") -> None:
        self._thread_device()
        peer = link[0]
        broken = None
        while True:
            rid, data, hashes, ev, nblocks = q.get()
            if broken is not None:
                if rid is not None:
                    self._done.put(("send", rid, broken))
                continue
            try:
                if ev is not None:
                    ev.synchronize()
                ok = rid is not None
                n = len(hashes) if ok else 0
                nbytes = data.numel() if ok else 0
                self._sync(self.pg.send([torch.tensor([int(ok), nblocks, nbytes, n], dtype=torch.int64,
                                                      device=self.device)], peer, _TAG))
                if ok:
                    if n:
                        self._sync(self.pg.send([torch.tensor(hashes, dtype=torch.int64, device=self.device)],
                                                peer, _TAG))
                    if nbytes:
                        self._sync(self.pg.send([data], peer, _TAG))
                    self._done.put(("send", rid, None))
            except Exception as e:  # noqa: BLE001 - the peer died or hung past the timeout
                broken = f"send to rank {peer} failed: {_short(e)}"
                self._done.put(("broken", link, broken))
                if rid is not None:
                    self._done.put(("send", rid, broken))

    def _receiver(self, link: Link, q: "queue.Queue") -> None:
        self._thread_device()
        peer = link[0]
        broken = None
        while True:
            rid = q.get()
            if broken is not None:
                self._done.put(("recv", rid, broken, None, None))
                continue
            try:
                header = torch.zeros(4, dtype=torch.int64, device=self.device)
                self._sync(self.pg.recv([header], peer, _TAG))
                ok, nblocks, nbytes, nh = header.tolist()
                if not ok:
                    self._done.put(("recv", rid, NO_KV, None, None))
                    continue
                if not (0 <= nh <= nblocks and 0 <= nbytes <= _MAX_PAYLOAD):
                    raise RuntimeError(f"corrupt transfer header {header.tolist()}")
                hashes: List[int] = []
                if nh:
                    h = torch.empty(nh, dtype=torch.int64, device=self.device)
                    self._sync(self.pg.recv([h], peer, _TAG))
                    hashes = h.tolist()
                data = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                if nbytes:
                    self._sync(self.pg.recv([data], peer, _TAG))
                self._done.put(("recv", rid, None, hashes, data))
            except Exception as e:  # noqa: BLE001 - the peer died or hung past the timeout
                broken = f"receive from rank {peer} failed: {_short(e)}"
                self._done.put(("broken", link, broken))
                self._done.put(("recv", rid, broken, None, None))
