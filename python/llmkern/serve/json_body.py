"""A request body as a JSON object: size-limited while it arrives, its nesting depth limited
before it is parsed (json.loads recurses per level: ~1000 levels are a RecursionError), and every
failure a 400/413 naming the body."""
from __future__ import annotations

import json
import re

from .errors import APIError

MAX_DEPTH = 64          # OpenAI bodies nest a handful of levels (messages -> content parts -> ...)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)     # brackets inside strings do not nest
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes, limit: int) -> int:
    """The deepest nesting of arrays / objects in `raw`, counted up to limit + 1 (it stops there)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def parse_object(raw: bytes, max_depth: int = MAX_DEPTH) -> dict:
    """A whole body's bytes -> the JSON object it holds, or a 400 naming the body."""
    if nesting_depth(raw, max_depth) > max_depth:
        raise APIError(400, f"body: JSON nested deeper than {max_depth} levels", param="body")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise APIError(400, f"body: not valid JSON ({e})", param="body")
    if not isinstance(body, dict):
        raise APIError(400, "body: expected a JSON object", param="body")
    return body


async def read_json(request, limit: int, max_depth: int = MAX_DEPTH) -> dict:
    """A request's body as a JSON object, read up to `limit` bytes (413 past it)."""
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise APIError(413, f"body: larger than the limit of {limit} bytes", param="body",
                           code="body_too_large")
    return parse_object(bytes(buf), max_depth)
