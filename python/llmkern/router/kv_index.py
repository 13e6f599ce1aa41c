"""ReplicaKV: the router's copy of one replica's prefix cache (the set of cached block hashes) and
load, kept current by the replica's snapshot and event stream (llmkern.serve.kv_events). Events
carry consecutive sequence numbers; a gap means something was missed, and the copy asks for a
snapshot instead of guessing.

Besides what the replica reports, the copy remembers the blocks of requests this router has just
sent there ("pending", until the replica's event for the block arrives, the request ends, or
PENDING_TTL_S passes: a queue under overload can hold a request longer than any fixed TTL): a
tenant's second request, arriving while the first one's prefill is still running, would otherwise
see no cached prefix anywhere and could warm a second copy of it on another replica."""
from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Dict, Iterable, List, Optional, Set

from ..engine.block_pool import chain_block_hashes

__all__ = ["ReplicaKV", "chain_block_hashes"]

PENDING_TTL_S = 600.0  # the router's request timeout: a request lost without an end ages out
REPORT_LAG_S = 0.1    # a load report may have left the replica this long before it arrives
LIVE_REQUESTS = 32    # a block asked of a replica in its last LIVE_REQUESTS requests is live there
RATE_S = 10.0         # the router's arrival rate is measured over this window


class ReplicaKV:
    def __init__(self):
        self.hashes: Set[int] = set()
        self.pending: Dict[int, float] = {}  # block hash -> expiry (time.monotonic())
        self.routed: deque = deque()  # (when, prompt tokens to compute) this router sent, not yet in a report
        self.seq: Optional[int] = None     # None: no snapshot yet (nothing is known)
        self.block_size: Optional[int] = None
        self.load = {"num_waiting": 0, "num_running": 0, "prefill_tokens_pending": 0, "kv_usage": 0.0}
        self.resyncs = 0
        self.clock = time.monotonic        # the router simulator (bench/router_sim.py) sets its own
        self.recent: "OrderedDict[int, int]" = OrderedDict()  # block hash -> number of the last request asking
        self.num_sent = 0                 # requests this router sent here
        self.sent: deque = deque()        # when this router sent a request here, within RATE_S

    @property
    def synced(self) -> bool:
        return self.seq is not None

    def apply_snapshot(self, snap: dict) -> None:
        self.hashes = set(snap["hashes"])
        self.seq = int(snap["seq"])
        self.block_size = int(snap["block_size"])
        if snap.get("load"):
            self.load = dict(snap["load"])
            self._reported()

    def apply_message(self, msg: dict) -> bool:
        """Apply one stream message; False when the copy fell out of step (a reset, or an event
        whose number is not the next one) and a snapshot is needed."""
        if msg.get("reset") or self.seq is None:
            self.invalidate()
            return False
        for seq, kind, h in msg.get("events", ()):
            if seq <= self.seq:            # already in the snapshot
                continue
            if seq != self.seq + 1:
                self.invalidate()
                return False
            if kind == "stored":
                self.hashes.add(h)
            elif kind == "removed":
                self.hashes.discard(h)
            self.pending.pop(h, None)
            self.seq = seq
        if msg.get("load"):
            self.load = dict(msg["load"])
            self._reported()
        return True

    def invalidate(self) -> None:
        if self.seq is not None:
            self.resyncs += 1
        self.seq = None
        self.hashes = set()

    def _reported(self) -> None:
        """A load report arrived: it counts what this router sent up to REPORT_LAG_S ago (what
        was sent later may have crossed it on the way, and stays counted)."""
        cut = self.clock() - REPORT_LAG_S
        while self.routed and self.routed[0][0] < cut:
            self.routed.popleft()

    @property
    def routed_tokens(self) -> int:
        """Prompt tokens to compute this router sent here that the last report may not count."""
        return sum(n for _, n in self.routed)

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens waiting to be computed here: the replica's last report plus what this
        router sent since (reports come every 0.25 s)."""
        return int(self.load.get("prefill_tokens_pending", 0)) + self.routed_tokens

    def note_routed(self, hashes: Iterable[int], new_tokens: int = 0, now: Optional[float] = None) -> None:
        """This router sent a request with these block hashes (and new_tokens prompt tokens not
        cached here) to this replica: count the blocks as cached until the replica's events say
        so (or PENDING_TTL_S passes), and the tokens as queued until its next load report."""
        now = self.clock() if now is None else now
        self.sent.append(now)
        self.sent_per_s(now)               # ages the window out (bounded whatever the policy)
        if new_tokens:
            self.routed.append((now, new_tokens))
        if len(self.pending) > 65536:  # bound the memory: drop what aged out
            self.pending = {h: t for h, t in self.pending.items() if t > now}
        self.num_sent += 1
        for h in hashes:
            if h not in self.hashes:
                self.pending[h] = now + PENDING_TTL_S
            self.recent[h] = self.num_sent
            self.recent.move_to_end(h)
        while self.recent and next(iter(self.recent.values())) <= self.num_sent - LIVE_REQUESTS:
            self.recent.popitem(last=False)

    def sent_per_s(self, now: Optional[float] = None) -> float:
        """Requests per second this router sent here over the last RATE_S."""
        now = self.clock() if now is None else now
        while self.sent and self.sent[0] < now - RATE_S:
            self.sent.popleft()
        return len(self.sent) / RATE_S

    def live_blocks(self, exclude: Iterable[int] = ()) -> int:
        """Blocks asked of this replica by its last LIVE_REQUESTS requests from this router, other
        than `exclude`: the prefixes its traffic keeps coming back for (they stay cached only while
        they fit). Counted in requests, not seconds: a tenant that comes back every minute at a low
        rate, or behind a long queue, is as live as one that comes back every second."""
        return len(self.recent) - sum(1 for h in exclude if h in self.recent)

    def settle(self, hashes: Iterable[int]) -> None:
        """A request sent here ended: its blocks are cached now (their events came before its
        last token) or never will be; stop counting them as about to be."""
        for h in hashes:
            self.pending.pop(h, None)

    def matched_blocks(self, hashes: Iterable[int], now: Optional[float] = None) -> int:
        """How many leading blocks of a request (its chained hashes) this replica holds or is
        about to hold (pending). Chaining makes a hash stand for its whole prefix, so the first
        miss ends the match."""
        now = self.clock() if now is None else now
        n = 0
        for h in hashes:
            if h not in self.hashes and self.pending.get(h, 0.0) <= now:
                break
            n += 1
        return n


def request_hashes(token_ids: List[int], block_size: int) -> List[int]:
    """The request's block hashes as the engine computes them: every full block but the one that
    holds the last prompt token (the engine always recomputes at least one token)."""
    return chain_block_hashes(token_ids[:len(token_ids) - 1], block_size)
