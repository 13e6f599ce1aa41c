"""The results file of a resumable job.

While the job runs, each result is appended as one JSON line and flushed the moment it is known
(completion order), so a crash, SIGKILL or Ctrl-C loses at most the line being written. Running the
job again with resume reads the file back (a torn last line is cut off), skips every line whose
result is there, and appends the rest. When every line has a result the file is rewritten in input
order, atomically (temporary file + rename): the finished file is the same whether or not the job
was interrupted. Error records are retried on resume."""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from .jsonl import Item, record_key


def dumps(record: dict) -> str:
    return json.dumps({k: v for k, v in record.items() if v is not None}, ensure_ascii=False) + "\n"


class JobError(Exception):
    """A job cannot start (its message names the option at fault)."""


class ResultsFile:
    def __init__(self, path: str, mode: Optional[str] = None):
        """mode: "resume" (keep finished results), "overwrite" (start over) or None (the file must
        not hold results yet)."""
        if mode not in (None, "resume", "overwrite"):
            raise ValueError(f"mode: expected 'resume', 'overwrite' or None, got {mode!r}")
        self.path = path
        self.offsets: Dict[str, int] = {}   # key -> byte offset of its latest record
        self.ok: Dict[str, bool] = {}       # key -> a result (not an error)
        if os.path.isdir(path):
            raise JobError(f"--output: {path!r} is a directory")
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        if exists and mode is None:
            raise JobError(f"--output: {path!r} already holds results; pass --resume to finish that job "
                           f"or --overwrite to start over")
        self.f = None
        self._append = exists and mode == "resume"
        try:
            if self._append:
                self._load()
            with open(path, "ab"):  # writable? (probed without truncating)
                pass
        except OSError as e:
            raise JobError(f"--output: cannot write {path!r}: {e.strerror or e}") from None

    def open(self) -> None:
        """Start writing: append to the results kept by resume, else truncate. Called once the
        engine is up, so a job that fails to start leaves an existing file alone."""
        if self.f is None:
            self.f = open(self.path, "ab" if self._append else "wb")

    def _load(self) -> None:
        good = 0
        with open(self.path, "rb") as f:
            while True:
                pos = f.tell()
                raw = f.readline()
                if not raw:
                    break
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("torn line")
                    rec = json.loads(raw)
                    key = record_key(rec.get("id"), int(rec["line"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    break  # a line cut short by the crash: everything from here is rewritten
                self.offsets[key] = pos
                self.ok[key] = "error" not in rec
                good = f.tell()
        if good < os.path.getsize(self.path):
            os.truncate(self.path, good)

    def done(self, item: Item) -> bool:
        return self.ok.get(item.key, False)

    def write(self, item: Item, record: dict) -> None:
        self.open()
        pos = self.f.tell()
        self.f.write(dumps(record).encode("utf-8"))
        self.f.flush()
        self.offsets[item.key] = pos
        self.ok[item.key] = "error" not in record

    def finalize(self, items: List[Item]) -> int:
        """Rewrite the file in input order (each record's "line" set to its current line); results
        of keys no longer in the input are dropped and counted."""
        self.open()
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        tmp = self.path + ".tmp"
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            for it in items:
                pos = self.offsets.get(it.key)
                if pos is None:
                    continue
                src.seek(pos)
                rec = json.loads(src.readline())
                rec["line"] = it.line
                dst.write(dumps(rec).encode("utf-8"))
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, self.path)
        return len(set(self.offsets) - {it.key for it in items})

    def close(self) -> None:
        if self.f is not None and not self.f.closed:
            self.f.close()
