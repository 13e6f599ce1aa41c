"""Reading a job's JSONL input: every line on its own (a bad line is reported with its number, the
rest run), each with the key that identifies its result across runs: its "id", else its line number."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass
class Item:
    line: int                 # 1-based line number in the input
    key: str                  # "id:<json of id>" or "line:<n>"
    obj: Any = None           # the parsed JSON value (None if the line is bad)
    error: Optional[str] = None

    @property
    def ident(self):
        return self.obj.get("id") if isinstance(self.obj, dict) else None


def record_key(ident, line: int) -> str:
    return f"id:{json.dumps(ident, sort_keys=True)}" if ident is not None else f"line:{line}"


def read_items(path: str) -> List[Item]:
    """Items for every non-blank line. A line whose "id" repeats an earlier one is an error (results
    are matched to lines by id when a job resumes)."""
    items: List[Item] = []
    first: Dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                items.append(Item(lineno, record_key(None, lineno),
                                  error=f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"))
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                items.append(Item(lineno, record_key(None, lineno), error=f"not valid JSON ({e})"))
                continue
            except RecursionError:
                items.append(Item(lineno, record_key(None, lineno), error="not valid JSON (nested too deeply)"))
                continue
            ident = obj.get("id") if isinstance(obj, dict) else None
            key = record_key(ident, lineno)
            if ident is not None and key in first:
                items.append(Item(lineno, record_key(None, lineno), obj,
                                  f"duplicate id {json.dumps(ident)} (first on line {first[key]})"))
                continue
            first[key] = lineno
            items.append(Item(lineno, key, obj))
    return items
