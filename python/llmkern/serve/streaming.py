"""Running one parsed request through the EngineLoop: its final outputs (non-streaming) or its
Server-Sent Events exactly as OpenAI sends them (`data: {json}\\n\\n` chunks, the usage chunk when
asked, `data: [DONE]`). Whatever ends a stream early (disconnect, error) aborts what is left."""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, List, Optional, Tuple

from .errors import APIError, request_error
from .protocol import GenerationRequest, chunk, delta_choice, echoed, finish_reason, logprobs_obj, usage


def _as_error(item) -> Optional[APIError]:
    """An APIError for an error item or a final output that carries no result (queue timeout)."""
    if isinstance(item, APIError):
        return item
    if getattr(item, "finished", False) and item.finish_reason == "timeout":
        return APIError(503, "the request waited in the queue past the server's queue timeout without "
                             "starting; retry later", code="queue_timeout", headers={"Retry-After": "1"})
    if getattr(item, "finished", False) and (item.error is not None or item.finish_reason == "error"):
        # failed alone (a fault in its step, a failed KV hand-over): the engine serves on
        return request_error(item.error or "the request failed in the engine")
    return None


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Run:
    """The engine requests of one HTTP request (one per prompt) and their merged outputs."""

    def __init__(self, loop, handles):
        self.loop = loop
        self.handles = handles
        self.finished = set()             # prompt indices whose final output arrived
        self._merged: asyncio.Queue = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self._forward(i, h)) for i, h in enumerate(handles)]

    async def _forward(self, i, h):
        while True:
            item = await h.queue.get()
            await self._merged.put((i, item))
            if isinstance(item, APIError) or item.finished:
                return

    async def next(self) -> Tuple[int, object]:
        i, item = await self._merged.get()
        if isinstance(item, APIError) or item.finished:
            self.finished.add(i)
        return i, item

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.handles)

    def close(self) -> None:
        """Abort whatever has not finished (client gone, error, shutdown) and stop forwarding."""
        for i, h in enumerate(self.handles):
            if i not in self.finished:
                self.loop.abort(h.request_id)
        for t in self._tasks:
            t.cancel()


async def final_outputs(run: Run) -> List[object]:
    """Every prompt's final output, in order; raises the first error."""
    outs = [None] * len(run.handles)
    while not run.done:
        i, item = await run.next()
        err = _as_error(item)
        if err is not None:
            raise err
        if item.finished:
            outs[i] = item
    return outs


async def first_item(run: Run):
    """The first output of a stream. An error before it is raised, to answer with an HTTP error,
    except a request the engine failed (request_error): a stream reports that as an error event."""
    i, item = await run.next()
    err = _as_error(item)
    if err is not None and err.code != "request_error":
        raise err
    return i, item


async def stream_events(req: GenerationRequest, model: str, run: Run, first, tokenizer=None) -> AsyncIterator[str]:
    n = req.params.n
    closed = set()
    offsets = {}   # choice -> characters of token text reported with logprobs so far
    p_tok = c_tok = 0
    usage_key = req.include_usage
    try:
        if req.kind == "chat":   # OpenAI opens each choice with its role
            yield sse(chunk(req, model, [delta_choice(req, i, "", None, role=True)
                                         for i in range(len(run.handles) * n)], None, usage_key))
        item = first
        while True:
            pi, out = item
            err = _as_error(out)
            if err is not None:
                yield sse(err.body())
                break
            leads, choices, finals = [], [], []   # leads: echoed prompts, a chunk of their own
            for c in out.outputs:
                idx = pi * n + c.index
                if idx in closed:
                    continue
                if c.finished:
                    closed.add(idx)
                if req.tools is not None:   # tool calls are known whole at the end: sent then
                    if c.finished:
                        finals.append(tool_delta(req, idx, c))
                    continue
                if req.echo and idx not in offsets:   # the prompt first, then what follows it
                    text, ids, lps = echoed(req, out, c, tokenizer)
                    lead = len(text) - len(c.text) if not req.echo_only else len(text)
                    k = len(out.prompt_token_ids)
                    lp0 = logprobs_obj(req, tokenizer, ids[:k], lps[:k]) if lps is not None else None
                    leads.append(delta_choice(req, idx, text[:lead], None, logprobs=lp0))
                    offsets[idx] = lead
                if req.echo_only:
                    if c.finished:
                        choices.append(delta_choice(req, idx, "", c.finish_reason))
                    continue
                lp = None
                if c.delta_logprobs:
                    lp = logprobs_obj(req, tokenizer, c.delta_token_ids, c.delta_logprobs, offsets.get(idx, 0))
                    if req.kind != "chat":
                        offsets[idx] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                if req.kind == "chat":
                    if c.delta_text or lp:
                        choices.append(delta_choice(req, idx, c.delta_text, None, logprobs=lp))
                    if c.finished:
                        finals.append(delta_choice(req, idx, None, c.finish_reason))
                elif c.delta_text or c.finished or lp:
                    choices.append(delta_choice(req, idx, c.delta_text, c.finish_reason if c.finished else None,
                                                logprobs=lp))
            for group in (leads, choices, finals):
                if group:
                    yield sse(chunk(req, model, group, None, usage_key))
            if out.finished:
                p_tok += len(out.prompt_token_ids)
                c_tok += sum(len(c.token_ids) for c in out.outputs)
            if run.done:
                if req.include_usage:
                    yield sse(chunk(req, model, [], usage(p_tok, c_tok), True))
                break
            item = await run.next()
        yield "data: [DONE]\n\n"
    finally:
        run.close()


def tool_delta(req: GenerationRequest, idx: int, c) -> dict:
    """The last chunk of a chat choice with tools: its text or its tool calls, and why it ended."""
    content, calls = req.tools.extract(c.text)
    reason = finish_reason(c.finish_reason)
    delta = {}
    if calls:
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(calls)]
        reason = "stop" if req.tools.choice == "named" else "tool_calls"
    if content:
        delta["content"] = content
    return {"index": idx, "delta": delta, "logprobs": None, "finish_reason": reason}

