"""What became of one request, for runs that check a server's failure handling (bench chaos):
completed (200 and a whole answer), failed with a clean error (an OpenAI error object, as the
status's body or as a stream's last event before [DONE]), or lost (no answer within the timeout, a
connection that broke, a stream that ended without [DONE], a body that is not the API's)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

COMPLETED, FAILED, LOST = "completed", "failed", "lost"


@dataclass
class Outcome:
    kind: str
    status: Optional[int] = None
    code: Optional[str] = None          # the error object's code (failed)
    detail: str = ""


def _error(obj) -> Optional[dict]:
    err = obj.get("error") if isinstance(obj, dict) else None
    return err if isinstance(err, dict) and "message" in err else None


def _failed(status: int, body: bytes) -> Outcome:
    try:
        err = _error(json.loads(body))
    except ValueError:
        err = None
    if err is None:
        return Outcome(LOST, status, detail=f"HTTP {status} without an error object: {body[:200]!r}")
    return Outcome(FAILED, status, err.get("code"), err.get("message", ""))


async def send_checked(client, url: str, body: dict, timeout: float) -> Outcome:
    """POST body to url (streamed when body["stream"]) and classify the answer."""
    import asyncio

    try:
        return await asyncio.wait_for(_send(client, url, body), timeout)
    except asyncio.TimeoutError:
        return Outcome(LOST, detail=f"no answer within {timeout} s")
    except Exception as e:  # noqa: BLE001 - any transport failure is a lost request
        return Outcome(LOST, detail=f"{type(e).__name__}: {e}")


async def _send(client, url: str, body: dict) -> Outcome:
    if not body.get("stream"):
        r = await client.post(url, json=body)
        if r.status_code != 200:
            return _failed(r.status_code, r.content)
        obj = r.json()
        if not obj.get("choices"):
            return Outcome(LOST, 200, detail=f"no choices: {r.text[:200]}")
        return Outcome(COMPLETED, 200)
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            return _failed(r.status_code, await r.aread())
        last = None
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                err = _error(last)
                if err is not None:
                    return Outcome(FAILED, 200, err.get("code"), err.get("message", ""))
                return Outcome(COMPLETED, 200)
            try:
                last = json.loads(line[6:])
            except ValueError:      # an event torn by a replica that died mid-write: the error follows
                last = None
        return Outcome(LOST, 200, detail="the stream ended without [DONE]")
