"""Worker: one replica as the router sees it: its URL, health, the copy of its prefix cache and
load (ReplicaKV), the requests this router has in flight there, and per-replica counters. Two
background tasks keep it current: a health check, and the KV sync (snapshot, then the event
stream from the snapshot's sequence number on; again from a snapshot after any gap or reset), or,
for a worker given a ZMQ endpoint, the vLLM-format event stream (kv_zmq.py)."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Optional

import httpx

from .kv_index import ReplicaKV

log = logging.getLogger("llmkern.router")


class Worker:
    def __init__(self, url: str, health_interval_s: float = 1.0, health_timeout_s: float = 2.0,
                 zmq_events: Optional[dict] = None):
        self.url = url.rstrip("/")
        self.kv = ReplicaKV()
        self.zmq_events = zmq_events      # {"endpoint", "replay", "topic"}: KV from ZMQ, not SSE
        self.healthy = False          # until the first health check answers
        self.inflight = 0
        self.requests = 0             # requests sent here (attempts)
        self.retried = 0              # attempts here that failed before streaming and went elsewhere
        self.failed = 0               # requests that failed here after streaming began (client saw an error)
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self._tasks = []

    def start(self, client: httpx.AsyncClient) -> None:
        if self.zmq_events is not None:
            from .kv_zmq import ZmqKVFollower

            kv_sync = ZmqKVFollower(self.kv, **self.zmq_events).run()
        else:
            kv_sync = self._sync_loop(client)
        self._tasks = [asyncio.ensure_future(self._health_loop(client)), asyncio.ensure_future(kv_sync)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except BaseException:  # noqa: B902 - cancelled or already failed: nothing to report
                pass
        self._tasks = []

    def mark_down(self, why: str) -> None:
        if self.healthy:
            log.warning("llmkern router: worker %s taken out (%s)", self.url, why)
        self.healthy = False
        self.kv.invalidate()

    async def check_health(self, client: httpx.AsyncClient) -> bool:
        try:
            r = await client.get(self.url + "/health", timeout=self.health_timeout_s)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok and not self.healthy:
            log.warning("llmkern router: worker %s is healthy", self.url)
            self.healthy = True
        elif not ok:
            self.mark_down("health check failed")
        return ok

    async def _health_loop(self, client) -> None:
        while True:
            await self.check_health(client)
            await asyncio.sleep(self.health_interval_s)

    async def _sync_loop(self, client) -> None:
        while True:
            if not self.healthy:
                await asyncio.sleep(0.1)
                continue
            try:
                await self._sync_once(client)
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
                log.info("llmkern router: KV sync with %s interrupted (%s)", self.url, e)
            self.kv.invalidate()
            await asyncio.sleep(0.1)

    async def _sync_once(self, client) -> None:
        r = await client.get(self.url + "/kv/snapshot", timeout=10)
        r.raise_for_status()
        self.kv.apply_snapshot(r.json())
        timeout = httpx.Timeout(10.0, read=5.0)   # the stream sends a heartbeat every 0.25 s
        async with client.stream("GET", self.url + "/kv/events", params={"since": self.kv.seq},
                                 timeout=timeout) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and not self.kv.apply_message(json.loads(line[6:])):
                    return       # out of step: a fresh snapshot

    def info(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "synced": self.kv.synced, "kv_seq": self.kv.seq,
                "cached_blocks": len(self.kv.hashes), "inflight": self.inflight, "load": self.kv.load,
                "requests": self.requests, "retried": self.retried, "failed": self.failed,
                "resyncs": self.kv.resyncs, "kv_events": "zmq" if self.zmq_events else "sse"}
