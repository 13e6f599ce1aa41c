"""The fault-injection switch for tests: LLMKERN_FAULT_INJECT, read once when an Engine is built.

Comma-separated rules:
  prepare:REGEX / forward:REGEX / sample:REGEX  while a step runs that phase with a request whose
      prompt text (decoded from the ids when only ids were given) or request_id matches REGEX
      (re.search), raise an InjectedFault attributable to that request;
  fatal:REGEX  the same trigger (checked in the forward phase), but the fault is not attributable
      to a request: the engine dies;
  delay_ms:N  sleep N ms in every step that runs the model (a slow replica).
Unset, the engine holds None and pays nothing."""
from __future__ import annotations

import os
import re
import time
import weakref
from typing import Dict, List, Optional, Tuple

ENV = "LLMKERN_FAULT_INJECT"
PHASES = ("prepare", "forward", "sample", "fatal")


class InjectedFault(RuntimeError):
    """A fault raised on purpose. request_id: the request it is attributed to (None for fatal)."""

    def __init__(self, message: str, request_id: Optional[str] = None, fatal: bool = False):
        super().__init__(message)
        self.request_id = request_id
        self.fatal = fatal


def parse_rules(spec: str) -> Tuple[Dict[str, List["re.Pattern"]], float]:
    """({phase: [patterns]}, delay in seconds) of a LLMKERN_FAULT_INJECT value; ValueError names
    the bad rule."""
    rules: Dict[str, List[re.Pattern]] = {}
    delay = 0.0
    for rule in filter(None, (r.strip() for r in spec.split(","))):
        kind, sep, arg = rule.partition(":")
        if not sep:
            raise ValueError(f"{ENV}: rule {rule!r} is not KIND:ARG")
        if kind == "delay_ms":
            try:
                delay += float(arg) / 1e3
            except ValueError:
                raise ValueError(f"{ENV}: delay_ms expects a number of milliseconds, got {arg!r}") from None
            continue
        if kind not in PHASES:
            raise ValueError(f"{ENV}: unknown rule kind {kind!r} (expected one of {', '.join(PHASES)}, delay_ms)")
        try:
            rules.setdefault(kind, []).append(re.compile(arg))
        except re.error as e:
            raise ValueError(f"{ENV}: {kind}: bad regular expression {arg!r} ({e})") from None
    return rules, delay


class FaultInjector:
    def __init__(self, spec: str, tokenizer=None):
        self.rules, self.delay_s = parse_rules(spec)
        self.tokenizer = tokenizer
        self._texts = weakref.WeakKeyDictionary()   # request -> prompt text, decoded once

    @classmethod
    def from_env(cls, tokenizer=None) -> Optional["FaultInjector"]:
        spec = os.environ.get(ENV, "").strip()
        return cls(spec, tokenizer) if spec else None

    def delay(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)

    def check(self, phase: str, seqs) -> None:
        """Raise an InjectedFault if a rule of `phase` (forward: also fatal) matches a sequence's request."""
        kinds = (phase, "fatal") if phase == "forward" else (phase,)
        for kind in kinds:
            pats = self.rules.get(kind)
            if not pats:
                continue
            for seq in seqs:
                req = seq.request
                if any(p.search(req.request_id) or p.search(self._text(req)) for p in pats):
                    if kind == "fatal":
                        raise InjectedFault(f"injected fatal fault (request {req.request_id})", fatal=True)
                    raise InjectedFault(f"injected {kind} fault", request_id=req.request_id)

    def _text(self, req) -> str:
        text = self._texts.get(req)
        if text is None:
            text = req.prompt
            if text is None:
                text = self.tokenizer.decode(req.prompt_token_ids, False) if self.tokenizer is not None else ""
            self._texts[req] = text
        return text
