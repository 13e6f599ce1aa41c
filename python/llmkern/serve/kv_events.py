"""KVEventPublisher: a replica's prefix-cache state for routers. The block pool's hook calls
record() on the engine thread; every event gets the next sequence number and is kept in a bounded
log, and a mirror set of the cached block hashes answers snapshots. Both are read under one lock,
so a snapshot (hashes, seq) is exactly the state after event `seq`: a router applies events from
seq + 1 on. The HTTP side (routes in app.py) serves them as an SSE stream and a JSON snapshot."""
from __future__ import annotations

import threading
from collections import deque
from typing import List, Optional, Set, Tuple

EVENT_LOG_SIZE = 1 << 16   # events kept for routers that reconnect; older ones need a snapshot


class KVEventPublisher:
    def __init__(self, block_size: int, max_events: int = EVENT_LOG_SIZE):
        self.block_size = block_size
        self._lock = threading.Lock()
        self._log: deque = deque(maxlen=max_events)   # (seq, kind, hash)
        self._hashes: Set[int] = set()
        self.seq = 0

    def attach(self, engine) -> "KVEventPublisher":
        """Subscribe to the engine's block pool (blocks already cached are taken as the start)."""
        pool = engine.kv.pool
        self.block_size = engine.kv.block_size
        with self._lock:
            self._hashes = set(pool.cached)
        pool.on_event = self.record
        return self

    def record(self, kind: str, block_hash: int) -> None:
        with self._lock:
            if kind == "stored":
                self._hashes.add(block_hash)
            else:
                self._hashes.discard(block_hash)
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
