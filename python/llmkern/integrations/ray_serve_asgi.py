"""Run one HTTP request through an ASGI app in-process and yield its response as it is sent:
first {"status", "headers"}, then the body's chunks. A Ray Serve replica uses it to answer with
llmkern's own FastAPI app (serve/app.py: parsing, validation, errors, SSE), so that Ray Serve adds
no second copy of the OpenAI handling. (httpx's ASGI transport buffers the whole body, which would
break streaming.)"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, List, Tuple, Union


async def asgi_request(app, method: str, path: str, query: bytes, headers: List[Tuple[str, str]],
                       body: bytes) -> AsyncIterator[Union[dict, bytes]]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}
    out: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()       # set when our caller stops reading: the app sees a disconnect
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg):
        await out.put(msg)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: out.put_nowait(None))
    try:
        while True:
            msg = await out.get()
            if msg is None:
                task.result()    # the app's own exception, if it raised before answering
                return
            if msg["type"] == "http.response.start":
                yield {"status": msg["status"],
                       "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", ())]}
            elif msg["type"] == "http.response.body":
                if msg.get("body"):
                    yield msg["body"]
                if not msg.get("more_body"):
                    return
    finally:
        gone.set()               # a client that left: llmkern's app aborts the request's run
        try:
            await asyncio.wait_for(task, 5.0)
        except BaseException:  # noqa: B902 - the app's end after a disconnect is not the caller's concern
            pass
