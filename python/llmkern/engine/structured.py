"""Structured outputs in the engine: a grammar matcher per constrained sequence, the token bitmask
of each step's sampling rows, and the matchers advanced by the tokens sampled.

The bitmask of a step is filled on a worker thread while the model runs (start() when the step's
inputs are prepared, bitmask() just before sampling): a matcher only changes when its sequence
gets a token, which happens after sampling, so the rows are final by the time the forward starts.
The sampling kernels apply the mask in the same pass as temperature and top-k/top-p/min-p."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from .grammar import GrammarCompiler, Matcher, new_bitmask


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: List[int]):
        self._args = (tokenizer, vocab_size, list(eos_token_ids))
        self._compiler: Optional[GrammarCompiler] = None
        self._lock = threading.Lock()
        self.matchers: Dict[int, Matcher] = {}          # seq_id -> matcher (engine thread)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Tuple[List[int], Future]] = None

    @property
    def compiler(self) -> GrammarCompiler:
        with self._lock:   # built on first use (a vocabulary scan), from any thread
            if self._compiler is None:
                self._compiler = GrammarCompiler(*self._args)
            return self._compiler

    def compile(self, so):
        """Compile (or find cached) a constraint; a bad one raises ParamError. Thread-safe: the
        server compiles off the event loop before submitting, so the engine thread only hits the cache."""
        return self.compiler.compile(so)

    def add(self, req) -> None:
        so = req.params.structured_outputs
        if so is None:
            return
        compiled = self.compile(so)
        for seq in req.seqs:
            self.matchers[seq.seq_id] = self.compiler.matcher(compiled)

    def drop(self, seq) -> None:
        self.matchers.pop(seq.seq_id, None)

    def advance(self, seq, token: int) -> bool:
        """Follow a sampled token; True when the grammar is complete (the sequence stops)."""
        m = self.matchers.get(seq.seq_id)
        if m is None:
            return False
        if not m.accept(token):
            raise RuntimeError(f"token {token} is outside the request's grammar")
        return m.terminated

    # -- the bitmask of a step ---------------------------------------------------------------------
    def _fill(self, seq_ids: List[int]):
        bm = new_bitmask(len(seq_ids), self.compiler.words)
        rows = [r for r, sid in enumerate(seq_ids) if sid in self.matchers]
        self.compiler.fill_rows([self.matchers[seq_ids[r]] for r in rows], bm, rows)
        return bm

    def start(self, sample_seqs) -> None:
        """Begin filling the masks of a step's sampling rows (overlapping the forward)."""
        self._pending = None
        if not self.matchers or not sample_seqs or not any(s.seq_id in self.matchers for s in sample_seqs):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="llmkern-grammar")
        ids = [s.seq_id for s in sample_seqs]
        self._pending = (ids, self._pool.submit(self._fill, ids))

    def bitmask(self, sample_seqs, device=None):
        """See _bitmask; on `device` (the logits')."""
        bm = self._bitmask(sample_seqs)
        return bm if bm is None or device is None else bm.to(device, non_blocking=True)

    def _bitmask(self, sample_seqs):
        """int32 [len(sample_seqs), words] for the rows about to be sampled, or None when none is
        constrained. Rows the step dropped since start() (aborted in flight) are left out."""
        if not self.matchers or not any(s.seq_id in self.matchers for s in sample_seqs):
            self._pending = None
            return None
        ids = [s.seq_id for s in sample_seqs]
        pending, self._pending = self._pending, None
        if pending is None:
            return self._fill(ids)
        started, fut = pending
        bm = fut.result()
        if started == ids:
            return bm
        where = {sid: i for i, sid in enumerate(started)}
        if all(sid in where for sid in ids):
            return bm[[where[sid] for sid in ids]]
        return self._fill(ids)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
