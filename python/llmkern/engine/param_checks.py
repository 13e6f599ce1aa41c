"""Request-parameter checks at the type the engine and its kernels store: fp32 for the sampling
thresholds and penalties, int32 for top-k and token ids, int64 for seeds and counts. Written once
for SamplingParams, the HTTP layer and the CLI, so a value that passes here cannot overflow,
round to 0 or to inf later. Every error is a ParamError naming the field."""
from __future__ import annotations

import math
import numbers
import struct
from typing import List, Optional

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class ParamError(ValueError):
    """A bad request parameter: `param` is the field's name (the HTTP layer's error `param`); the
    message starts with it ("top_p: expected ...")."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def shown(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _fail(name: str, expected: str, v):
    raise ParamError(name, f"expected {expected}, got {shown(v)}")


def as_f32(name: str, v, lo: float, hi: float, expected: str, lo_open: bool = False) -> float:
    """A real number (not a bool) in [lo, hi] (or (lo, hi]) both as given and once rounded to
    fp32, where it must also stay finite (1e-50 rounds to 0, 1e39 to inf)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        _fail(name, expected, v)
    try:
        x = float(v)
        x32 = struct.unpack("f", struct.pack("f", x))[0]
    except (OverflowError, ValueError):   # beyond float64 or fp32
        _fail(name, expected, v)
    for y in (x, x32):
        if not math.isfinite(y) or y < lo or y > hi or (lo_open and y == lo):
            _fail(name, expected, v)
    return x


def as_int(name: str, v, lo: int, hi: int, expected: str) -> int:
    """An integer in [lo, hi]; an integral float (4.0) counts, as JSON and pydantic treat it, a
    bool does not."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
        _fail(name, expected, v)
    return int(v)


def as_bool(name: str, v) -> bool:
    if not isinstance(v, bool):
        _fail(name, "true or false", v)
    return v


def check_text(name: str, s: str) -> str:
    """A string that UTF-8 can encode (JSON lets a lone surrogate such as "\\ud800" through)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ParamError(name, f"contains a lone surrogate (U+{ord(s[e.start]):04X}) at index {e.start}; "
                               f"expected valid Unicode text") from None
    return s


def stop_strings(v) -> List[str]:
    """`stop`: None, a non-empty string or a list of them."""
    expected = "a non-empty string or a list of non-empty strings"
    items = [v] if isinstance(v, str) else v if isinstance(v, (list, tuple)) else None
    if v is None:
        return []
    if items is None or not all(isinstance(s, str) and s for s in items):
        _fail("stop", expected, v)
    return [check_text("stop", s) for s in items]


def token_ids(name: str, v, vocab_size: Optional[int] = None) -> List[int]:
    """A list of token ids: integers in [0, vocab_size), or in int32 when the vocabulary is not known."""
    hi = (vocab_size if vocab_size is not None else INT32_MAX + 1) - 1
    expected = f"a list of token ids (integers in [0, {hi}])"
    if not isinstance(v, (list, tuple)):
        _fail(name, expected, v)
    return [as_int(name, t, 0, hi, expected) for t in v]


def logit_bias(v, vocab_size: Optional[int] = None) -> dict:
    """OpenAI's logit_bias: {token id (an int, or its decimal string as JSON keys are): bias in
    [-100, 100]}; at most 1024 entries, as OpenAI allows."""
    if not isinstance(v, dict):
        _fail("logit_bias", "an object mapping token ids to numbers in [-100, 100]", v)
    if len(v) > 1024:
        raise ParamError("logit_bias", f"at most 1024 entries, got {len(v)}")
    hi = (vocab_size if vocab_size is not None else INT32_MAX + 1) - 1
    out = {}
    for k, b in v.items():
        key = k
        if isinstance(k, str) and k.strip().lstrip("-").isdigit():
            key = int(k)
        tid = as_int("logit_bias", key, 0, hi, f"token ids in [0, {hi}] as keys")
        out[tid] = as_f32("logit_bias", b, -100.0, 100.0, f"a bias in [-100, 100] for token {tid}")
    return out
