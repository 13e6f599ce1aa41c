"""Read-ahead for the disk KV tier: when a request is queued, a reader thread reads and checks the
prefix blocks it will look up on disk, so that admitting it later takes them from memory instead
of reading files on the engine thread (which every running request waits on)."""
from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from typing import Callable, Optional

log = logging.getLogger("llmkern.engine")
_HOLD_BYTES = 256 << 20  # payloads read ahead and not taken yet, at most (oldest dropped first)


class ReadAhead:
    """walk(token_ids, hashes, start, stop, read) -> [(key, payload)] is DiskLink's chain walk;
    read(key) reads one block file (None: absent or bad)."""

    def __init__(self, walk: Callable, read: Callable, block_bytes: int, jobs: int = 64):
        self._walk, self._read = walk, read
        self.held: "OrderedDict[int, tuple]" = OrderedDict()  # block hash -> (key, payload)
        self._max = max(16, _HOLD_BYTES // max(1, block_bytes))
        self._q: "queue.Queue" = queue.Queue(maxsize=jobs)
        self._thread: Optional[threading.Thread] = None

    def submit(self, token_ids, hashes, start: int, stop: int) -> None:
        """Queue blocks start..stop of a prompt (a full queue skips it: admission reads them)."""
        if start >= stop or hashes[start] in self.held:  # nothing to read, or read already
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmkern-kv-disk-read", daemon=True)
            self._thread.start()
        try:
            self._q.put_nowait((list(token_ids), list(hashes[:stop]), start, stop))
        except queue.Full:
            pass

    def take(self, key) -> Optional[memoryview]:
        """The payload read ahead for exactly this block, if any (then no longer held)."""
        got = self.held.pop(key[0], None)
        return got[1] if got is not None and got[0] == key else None

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=60)
            self._thread = None
        self.held.clear()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                for key, payload in self._walk(*job, self._read):
                    self.held[key[0]] = (key, payload)
                    while len(self.held) > self._max:
                        self.held.popitem(last=False)
            except Exception:  # admission reads the blocks itself
                log.exception("llmkern: disk KV tier: read-ahead failed")
