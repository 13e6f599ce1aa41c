"""KVEventPublisher: a replica's prefix-cache state for routers. The block pool's hook calls
record() on the engine thread; every event gets the next sequence number and is kept in a bounded
log, and a mirror set of the cached block hashes answers snapshots. Both are read under one lock,
so a snapshot (hashes, seq) is exactly the state after event `seq`: a router applies events from
seq + 1 on. The HTTP side (routes in app.py) serves them as an SSE stream and a JSON snapshot.
A sink (kv_events_zmq.ZmqKVEventSink, vLLM's wire format) may also get every event, in order,
with the stored block's parent hash and tokens."""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable, List, Optional, Set, Tuple

EVENT_LOG_SIZE = 1 << 16   # events kept for routers that reconnect; older ones need a snapshot


class KVEventPublisher:
    def __init__(self, block_size: int, max_events: int = EVENT_LOG_SIZE):
        self.block_size = block_size
        self._lock = threading.Lock()
        self._log: deque = deque(maxlen=max_events)   # (seq, kind, hash)
        self._hashes: Set[int] = set()
        self.seq = 0
        # Called under the lock, in event order: (kind, hash, parent hash, tokens). It must not
        # block (it runs on the engine thread).
        self.sink: Optional[Callable[[str, int, Optional[int], Optional[tuple]], None]] = None

    def attach(self, engine) -> "KVEventPublisher":
        """Subscribe to the engine's block pool (blocks already cached are taken as the start)."""
        pool = engine.kv.pool
        self.block_size = engine.kv.block_size
        with self._lock:
            self._hashes = set(pool.cached)
        self._pool = pool
        pool.on_event = self.record
        return self

    def connect_sink(self, sink) -> None:
        """Send every later event to sink too, after the blocks cached now (as stored events).
        Call it on the engine's thread or before the engine runs: the pool is read here."""
        with self._lock:
            pool = getattr(self, "_pool", None)
            for h, b in (pool.cached.items() if pool is not None else ()):
                sink("stored", h, pool.parent_hash(b), b.tokens)
            self.sink = sink

    def record(self, kind: str, block_hash: int, parent: Optional[int] = None, tokens: Optional[tuple] = None) -> None:
        with self._lock:
            if self.sink is not None:
                self.sink(kind, block_hash, parent, tokens)
            if kind == "cleared":    # the SSE log knows stored/removed only: one removal per block
                for h in self._hashes:
                    self._append("removed", h)
                self._hashes.clear()
                return
            if kind == "stored":
                self._hashes.add(block_hash)
            else:
                self._hashes.discard(block_hash)
            self._append(kind, block_hash)

    def _append(self, kind: str, block_hash: int) -> None:
        self.seq += 1
        self._log.append((self.seq, kind, block_hash))

    def snapshot(self) -> dict:
        with self._lock:
            return {"seq": self.seq, "block_size": self.block_size, "hashes": list(self._hashes)}

    def since(self, seq: int) -> Tuple[Optional[List[tuple]], int]:
        """(events after seq, current seq), or (None, current seq) when some of them have already
        left the log (the reader must take a snapshot)."""
        with self._lock:
            cur = self.seq
            if seq == cur:
                return [], cur
            if seq > cur:        # the reader saw another incarnation of this replica
                return None, cur
            if not self._log or self._log[0][0] > seq + 1:
                return None, cur
            start = len(self._log) - (cur - seq)
            return [self._log[i] for i in range(start, len(self._log))], cur
