"""The router's copy of a replica's prefix cache, kept from its KV events in vLLM's wire format
(ZMQ + msgpack, as `llmkern serve --kv-events-config` or vLLM publish them) instead of llmkern's
SSE stream. A worker is given as `URL,zmq=ENDPOINT[,replay=ENDPOINT][,topic=TOPIC]`.

The replica's hashes are its own (vLLM's differ from llmkern's); the router re-hashes every stored
block from its tokens and its parent with the engine's chained hash (what it computes for a
prompt), so a vLLM replica is matched the same way as an llmkern one. On start and after a gap in
the batch numbers it asks the replay socket (when given) for what it missed; a replica that
restarted (numbers going back) starts the copy over. Such a worker reports no load: the policies
see the router's own in-flight count for it."""
from __future__ import annotations

import asyncio
import logging
from typing import Dict, Optional, Tuple

from ..engine.block_pool import block_hash
from .kv_index import ReplicaKV

log = logging.getLogger("llmkern.router")
# vLLM's positional order after the tag, for the array form of its events (before tagged maps)
_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
           "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}
REPLAY_TIMEOUT_S = 5.0


def parse_worker_spec(spec: str) -> Tuple[str, Optional[dict]]:
    """'URL' -> (URL, None); 'URL,zmq=EP,replay=EP,topic=T' -> (URL, {"endpoint", "replay", "topic"})."""
    url, *opts = spec.split(",")
    if not opts:
        return url, None
    out = {"endpoint": None, "replay": None, "topic": ""}
    for o in opts:
        key, eq, val = o.partition("=")
        key = {"zmq": "endpoint"}.get(key.strip(), key.strip())
        if not eq or key not in out:
            raise ValueError(f"worker: {o!r}: expected zmq=ENDPOINT, replay=ENDPOINT or topic=TOPIC")
        out[key] = val.strip()
    if not out["endpoint"]:
        raise ValueError(f"worker: {spec!r}: the options need zmq=ENDPOINT (e.g. tcp://host:5557)")
    return url, out


def _event(ev) -> dict:
    return ev if isinstance(ev, dict) else {"type": ev[0], **dict(zip(_FIELDS.get(ev[0], ()), ev[1:]))}


class ZmqKVFollower:
    def __init__(self, kv: ReplicaKV, endpoint: str, replay: Optional[str] = None, topic: str = ""):
        self.kv, self.endpoint, self.replay_endpoint, self.topic = kv, endpoint, replay, topic
        self.ours: Dict[int, int] = {}     # the replica's hash -> the router's hash of the block
        self.last: Optional[int] = None    # the last batch number applied
        self.published = False             # kv.seq was set: a None there since is the worker's invalidate()

    def reset(self) -> None:
        self.ours.clear()
        self.last = None
        self.kv.hashes = set()
        self._publish()

    def _publish(self) -> None:
        """Mark the copy synced (the policies use it) once the block size is known: from the first
        BlockStored. Until then the copy stays unsynced, and the router routes on load alone."""
        if self.kv.block_size:
            self.kv.seq = -1 if self.last is None else self.last
            self.published = True

    def apply(self, seq: int, payload: bytes) -> None:
        import msgpack

        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        # [ts, events, rank] as vLLM sends it; a map batch too, should a later vLLM send one
        events = batch["events"] if isinstance(batch, dict) else batch[1]
        kv = self.kv
        for ev in map(_event, events):
            kind = ev.get("type")
            if kind == "BlockStored":
                bs, toks = int(ev["block_size"]), ev["token_ids"]
                kv.block_size = bs
                parent = ev["parent_block_hash"]
                own = 0 if parent is None else self.ours.get(parent)
                for i, h in enumerate(ev["block_hashes"]):
                    if own is None:        # a parent this copy never saw: the chain cannot be followed
                        break
                    own = block_hash(own, toks[i * bs:(i + 1) * bs])
                    self.ours[h] = own
                    kv.hashes.add(own)
                    kv.pending.pop(own, None)
            elif kind == "BlockRemoved":
                for h in ev["block_hashes"]:
                    own = self.ours.pop(h, None)
                    if own is not None:
                        kv.hashes.discard(own)
            elif kind == "AllBlocksCleared":
                self.ours.clear()
                kv.hashes = set()
        self.last = seq
        self._publish()

    async def _replay(self, ctx, start: int) -> None:
        """Apply the kept batches from `start` on (vLLM's replay protocol: an 8-byte big-endian
        start number; (number, payload) frames back, then number -1)."""
        import zmq

        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.replay_endpoint)
        try:
            await s.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                _, seq, payload = await asyncio.wait_for(s.recv_multipart(), REPLAY_TIMEOUT_S)
                n = int.from_bytes(seq, "big", signed=True)
                if n < 0:
                    return
                if self.last is None or n > self.last:
                    self.apply(n, payload)
        finally:
            s.close()

    async def run(self) -> None:
        """Follow the stream for as long as the worker is registered; an error (a replica not
        resolvable yet, a malformed batch) starts the copy over a second later."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the router keeps routing with what it knows
                log.info("llmkern router: KV events from %s interrupted (%s)", self.endpoint, e)
                self.kv.invalidate()
                await asyncio.sleep(1.0)

    async def _follow(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        try:
            self.published = False
            self.reset()
            await self._catch_up(ctx, 0)
            while True:
                if self.published and not self.kv.synced:   # the worker was taken out meanwhile
                    self.reset()
                    await self._catch_up(ctx, 0)
                if not await sub.poll(500):   # (so that a copy invalidated meanwhile is rebuilt)
                    continue
                _, seq, payload = await sub.recv_multipart()
                n = int.from_bytes(seq, "big")
                if self.last is not None and n <= self.last and n != 0:
                    continue                   # already applied from the replay
                if self.last is not None and n < self.last:
                    self.reset()               # numbers went back: the replica restarted
                    self.kv.resyncs += 1
                elif self.last is not None and n > self.last + 1:
                    self.kv.resyncs += 1       # a gap: what the replay still holds
                    await self._catch_up(ctx, self.last + 1)
                if self.last is None or n > self.last:
                    self.apply(n, payload)
        finally:
            sub.close()

    async def _catch_up(self, ctx, start: int) -> None:
        if self.replay_endpoint:
            try:
                await self._replay(ctx, start)
            except (asyncio.TimeoutError, ValueError, KeyError, TypeError) as e:
                log.info("llmkern router: KV replay from %s failed (%s)", self.replay_endpoint, e)
