"""ZmqKVEventSink: the replica's prefix-cache events in vLLM's wire format, so that KV-aware routers
written for vLLM (llm-d, production-stack, Dynamo) can route llmkern replicas.

Wire format (vLLM's ZmqEventPublisher): every batch is a PUB multipart message (topic, sequence
number as 8 big-endian bytes, payload), numbers counting batches from 0. The payload is msgpack:
[ts, events, data_parallel_rank], each event a tagged map (current vLLM) or, with event_format
"array", a positional array led by the tag (vLLM before its map encoding):
  {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
   "lora_id", "medium", "lora_name"}
  {"type": "BlockRemoved", "block_hashes", "medium"}
  {"type": "AllBlocksCleared"}
Hashes are the engine's chained block hashes as unsigned 64-bit integers (vLLM's are too). A
replay socket (ROUTER) answers a request frame (8-byte big-endian start number) with every kept
batch from that number on, each as (number, payload), then (-1, b"").

Threads: the engine thread only appends to a queue (the block pool's hook, through
KVEventPublisher.sink); a publisher thread batches, encodes and sends. The queue is bounded
(max_queue_size): when it overflows, what it holds is dropped (counted in `dropped`) and the next
batch is a resync, AllBlocksCleared followed by every cached block, from a mirror the engine thread
keeps (one dict operation per event), so a subscriber that applies every batch stays exact."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Dict, List, Optional, Tuple

from .kv_events_config import KVEventsConfig

log = logging.getLogger("llmkern.serve")
U64 = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_MS = 10   # the publisher thread's tick: the most an event waits before it is sent


def _binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard, ipc:// or inproc:// address is bound, a host:port is connected to;
    and (llmkern's) 0.0.0.0, which names no host to connect to, is bound too."""
    return ("*" in endpoint or "::" in endpoint or "//0.0.0.0:" in endpoint
            or endpoint.startswith(("ipc://", "inproc://")))


def encode_events(events: List[tuple], block_size: int, fmt: str = "map") -> list:
    """(kind, hash, parent, tokens) in order -> vLLM events; consecutive stored blocks of one chain
    share an event (as vLLM's per-request events), consecutive removals too."""
    out: list = []
    last = None     # (kind, event fields) of the event being extended
    for kind, h, parent, tokens in events:
        h = h & U64
        if kind == "stored":
            p = None if parent is None else parent & U64
            if last is not None and last[0] == "stored" and last[1]["block_hashes"][-1] == p:
                last[1]["block_hashes"].append(h)
                last[1]["token_ids"].extend(tokens)
                continue
            last = ("stored", {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": p,
                               "token_ids": list(tokens), "block_size": block_size, "lora_id": None,
                               "medium": "GPU", "lora_name": None})
        elif kind == "removed":
            if last is not None and last[0] == "removed":
                last[1]["block_hashes"].append(h)
                continue
            last = ("removed", {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"})
        else:
            last = ("cleared", {"type": "AllBlocksCleared"})
        out.append(last[1])
    return out if fmt == "map" else [[e["type"], *list(e.values())[1:]] for e in out]


class ZmqKVEventSink:
    def __init__(self, cfg: KVEventsConfig, block_size: int, data_parallel_rank: int = 0):
        try:
            import msgpack
            import zmq
        except ImportError as e:
            raise ValueError(f"--kv-events-config: needs pyzmq and msgpack (pip install 'llmkern[kv-events]'): {e}") from None

        self.cfg, self.block_size, self.rank = cfg, block_size, data_parallel_rank
        self._pack = msgpack.Packer()
        self._lock = threading.Lock()
        self._queue: deque = deque()
        self._state: Dict[int, Tuple[Optional[int], tuple]] = {}   # cached hash -> (parent, tokens)
        self._resync = False
        self.dropped = 0          # events dropped on overflow (each overflow is followed by a resync)
        self.seq = 0              # the next batch's number
        self._buffer: deque = deque(maxlen=cfg.buffer_steps)       # (number, payload) for replay
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._replay = None
        try:
            (self._pub.bind if _binds(cfg.endpoint) else self._pub.connect)(cfg.endpoint)
            if cfg.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(cfg.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(f"--kv-events-config: endpoint: cannot use {cfg.endpoint!r} / "
                             f"{cfg.replay_endpoint!r}: {e}") from None
        self._running = True
        self._thread = threading.Thread(target=self._run, name="llmkern-kv-events-zmq", daemon=True)
        self._thread.start()

    # -- engine thread ---------------------------------------------------------------------------
    def __call__(self, kind: str, h: int, parent: Optional[int], tokens: Optional[tuple]) -> None:
        with self._lock:
            if kind == "stored":
                self._state[h] = (parent, tokens)
            elif kind == "removed":
                self._state.pop(h, None)
            else:
                self._state.clear()
            if len(self._queue) >= self.cfg.max_queue_size:
                self.dropped += len(self._queue)
                self._queue.clear()
                if not self._resync:
                    log.warning("llmkern: KV event queue full (%d); dropped, a resync follows",
                                self.cfg.max_queue_size)
                self._resync = True
            if not self._resync:     # a resync sends the whole state anyway
                self._queue.append((kind, h, parent, tokens))

    # -- publisher thread ------------------------------------------------------------------------
    def _take(self) -> List[tuple]:
        with self._lock:
            if self._resync:
                self._resync = False
                self._queue.clear()
                return [("cleared", 0, None, None)] + [("stored", h, p, t) for h, (p, t) in self._state.items()]
            out = list(self._queue)
            self._queue.clear()
            return out

    def _run(self) -> None:
        while True:
            stopping = not self._running
            try:
                if self._replay is not None and self._replay.poll(POLL_MS):
                    self._serve_replay()
                elif self._replay is None:
                    time.sleep(POLL_MS / 1000)
                events = self._take()
                if events:
                    self._send(events)
            except Exception:  # noqa: BLE001 - never let a publishing error end the thread
                log.exception("llmkern: KV event publishing failed")
                time.sleep(0.1)
            if stopping:
                return

    def _send(self, events: List[tuple]) -> None:
        batch = [time.time(), encode_events(events, self.block_size, self.cfg.event_format), self.rank]
        payload = self._pack.pack(batch)
        seq = self.seq
        self.seq += 1
        self._buffer.append((seq, payload))
        self._pub.send_multipart((self.cfg.topic.encode(), seq.to_bytes(8, "big"), payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:          # (identity, empty delimiter, start number) from a REQ/DEALER
            log.warning("llmkern: malformed KV event replay request (%d frames)", len(frames))
            return
        ident, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((ident, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((ident, b"", END_SEQ, b""))

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish what is queued, stop the thread, close the sockets."""
        self._running = False
        self._thread.join(timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._pub, self._replay):
            if s is not None:
                s.close(linger=0)
