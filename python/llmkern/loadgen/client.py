"""The open-loop client: each request streamed over /v1/chat/completions (or /v1/completions, for
token-id prompts) at its arrival time, with its TTFT, inter-token latencies and end-to-end time
recorded."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import List, Optional

from .workload import Req


@dataclass
class Result:
    ok: bool = False
    ttft: Optional[float] = None
    itls: List[float] = field(default_factory=list)
    e2e: Optional[float] = None
    tokens: int = 0
    status: Optional[int] = None
    times: List[float] = field(default_factory=list)   # perf_counter() of each streamed token
    usage_tokens: Optional[int] = None   # the server's completion_tokens (completions: include_usage)

    @property
    def tpot(self) -> Optional[float]:
        """Time per output token after the first, as `vllm bench serve` computes it: (E2E - TTFT)
        over the output tokens less one (the server's count when it sent one)."""
        n = self.usage_tokens if self.usage_tokens is not None else self.tokens
        return None if not self.ok or n < 2 else (self.e2e - self.ttft) / (n - 1)


async def send_one(client, url: str, model: str, r: Req, t0: float, headers: dict, extra: Optional[dict] = None) -> Result:
    res = Result()
    await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
    start = t0 + r.arrival
    completions = url.endswith("/v1/completions")
    body = {"model": model, "max_tokens": r.max_tokens, "temperature": 0.0, "stream": True, **r.extra, **(extra or {})}
    if completions:
        body.update(prompt=r.prompt, stream_options={"include_usage": True})
    else:
        body["messages"] = [{"role": "user", "content": r.prompt}]
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if obj.get("error"):
                    return res
                if (obj.get("usage") or {}).get("completion_tokens") is not None:
                    res.usage_tokens = obj["usage"]["completion_tokens"]
                choices = obj.get("choices") or []
                if not choices or not (choices[0].get("text") if completions
                                       else (choices[0].get("delta") or {}).get("content")):
                    continue
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itls.append(now - last)
                last = now
                res.tokens += 1   # one chunk per token while streaming (both servers)
                res.times.append(now)
        res.e2e = time.perf_counter() - start
        res.ok = res.ttft is not None
    except Exception:  # noqa: BLE001 - a failed request counts as not meeting the SLO
        pass
    return res


async def drive(base: str, model: str, reqs: List[Req], timeout: float, api_key: Optional[str] = None,
                max_concurrency: Optional[int] = None, extra: Optional[dict] = None, endpoint: str = "/v1/chat/completions"):
    """(results in request order, wall seconds): reqs sent open-loop at their arrival times over
    streaming chat completions (endpoint "/v1/completions": completions, prompt as given, usage
    asked for). max_concurrency: at most that many in flight (a request waiting for a slot is timed
    from when it is sent). extra: more body fields for every request."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base + endpoint
    limits = httpx.Limits(max_connections=len(reqs) + 4, max_keepalive_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter() + 0.05
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def capped(r: Req) -> Result:
            await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
            async with sem:
                sent = replace(r, arrival=time.perf_counter() - t0)
                return await send_one(client, url, model, sent, t0, headers, extra)

        tasks = [asyncio.ensure_future(capped(r) if sem is not None else send_one(client, url, model, r, t0, headers,
                                                                                   extra))
                 for r in reqs]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        results = [t.result() if t in done else Result() for t in tasks]
        return results, time.perf_counter() - t0
