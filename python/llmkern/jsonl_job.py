"""The offline JSONL job behind `llmkern generate --input`: every input line is read on its own
(bad UTF-8, bad JSON, JSON nested absurdly deep, wrong field types: that line is reported with its
number and the rest run), and every result is written, flushed, as soon as it is known, so a failure
late in a long job keeps everything finished before it."""
from __future__ import annotations

import json
from typing import IO, Iterator, Optional, Tuple

PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")
_BOM = b"\xef\xbb\xbf"


def read_lines(f: IO[bytes]) -> Iterator[Tuple[int, object, Optional[str]]]:
    """(line number, parsed JSON or None, error or None) for every non-blank line of a binary file.
    A UTF-8 byte-order mark at the start is accepted."""
    for lineno, raw in enumerate(f, 1):
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield lineno, None, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
            continue
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line), None
        except json.JSONDecodeError as e:
            yield lineno, None, f"not valid JSON ({e})"
        except RecursionError:
            yield lineno, None, "not valid JSON (nested too deeply)"


def to_prompt(obj, chat: bool, has_template: bool):
    """The engine prompt for one JSON value: a string, or an object with exactly one of 'prompt'
    (string), 'messages' (list of {"role", "content"} objects) or 'prompt_token_ids' (list of ints).
    Wrong types are errors, never reinterpreted."""
    if isinstance(obj, str):
        return [{"role": "user", "content": obj}] if chat and has_template else obj
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with a 'prompt', 'messages' or 'prompt_token_ids' field, "
                         f"got {type(obj).__name__}")
    keys = [k for k in PROMPT_KEYS if k in obj]
    if len(keys) != 1:
        raise ValueError("needs exactly one of 'prompt', 'messages', 'prompt_token_ids'")
    k = keys[0]
    v = obj[k]
    if k == "prompt":
        if not isinstance(v, str):
            raise ValueError(f"'prompt' must be a string, got {type(v).__name__}")
        return to_prompt(v, chat, has_template)
    if k == "prompt_token_ids":
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise ValueError(f"'prompt_token_ids' must be a list of integers, got {_describe(v)}")
        return {k: v}
    if not isinstance(v, list) or not v or not all(isinstance(m, dict) for m in v):
        raise ValueError("'messages' must be a non-empty list of {\"role\", \"content\"} objects, "
                         f"got {_describe(v)}")
    return {k: v}


def _describe(v) -> str:
    return f"{type(v).__name__} {json.dumps(v)[:40]}"


def overrides(obj) -> dict:
    """Per-line sampling fields: top-level keys other than the prompt and id, plus a
    'sampling_params' object."""
    if not isinstance(obj, dict):
        return {}
    out = {k: v for k, v in obj.items() if k not in PROMPT_KEYS + ("id", "sampling_params")}
    extra = obj.get("sampling_params")
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"'sampling_params' must be an object, got {type(extra).__name__}")
    out.update(extra or {})
    return out


class ResultWriter:
    """JSONL results, one line per input line (in completion order, each with its "line"), flushed
    as written."""

    def __init__(self, f: IO[str]):
        self.f = f

    def write(self, record: dict) -> None:
        r = {k: v for k, v in record.items() if v is not None}
        self.f.write(json.dumps(r, ensure_ascii=False) + "\n")
        self.f.flush()

    def error(self, lineno: int, ident, msg: str) -> None:
        self.write({"line": lineno, "id": ident, "error": msg})

    def result(self, lineno: int, ident, out) -> None:
        m = out.metrics
        self.write({
            "line": lineno, "id": ident, "text": out.text, "token_ids": out.token_ids,
            "finish_reason": out.finish_reason,
            "outputs": [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                        for c in out.outputs] if len(out.outputs) > 1 else None,
            "metrics": {"ttft_s": m.ttft, "e2e_s": m.e2e, "prompt_tokens": m.num_prompt_tokens,
                        "output_tokens": m.num_output_tokens, "cached_prompt_tokens": m.num_cached_prompt_tokens},
        })
