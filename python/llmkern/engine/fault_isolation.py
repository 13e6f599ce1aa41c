"""Fault isolation for the engine step: when preparing inputs, running the model or sampling raises,
find the request(s) responsible, fail only them, and keep the engine serving the others.

A step's work before any sequence advances (prepare -> forward -> verify/sample) is re-run for
each request of the failed batch on its own ("probe"): failures are rare, so one model run per
request is an acceptable price for exactness, and bisecting would save little on the small
batches where it happens. The requests whose probe raises are failed (finish_reason "error",
their KV freed); the others were not advanced by the failed step and are simply scheduled again
(their KV writes are recomputed). The error ends the engine instead (it is re-raised) when it
is not attributable to requests: marked fatal, a device (CUDA) error, no probe reproduces it, or
the probe of every request that reached the failed phase fails too (several of them)."""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Tuple

import torch

from .faults import InjectedFault
from .scheduler import ScheduledBatch
from .sequence import Request

log = logging.getLogger("llmkern.engine")
PHASES = ("prepare", "forward", "sample")   # of a step's work, in order (what probe() re-runs)

_DEVICE_ERRORS = ("CUDA error", "CUDA driver error", "device-side assert", "illegal memory access", "cuBLAS",
                  "NCCL error", "out of memory")


def is_fatal(e: BaseException) -> bool:
    """Errors that say the engine (device, memory, process) is broken, whatever the request."""
    if not isinstance(e, Exception) or isinstance(e, MemoryError):
        return True
    if isinstance(e, InjectedFault):
        return e.fatal
    acc = getattr(torch, "AcceleratorError", None)
    if acc is not None and isinstance(e, acc):
        return True
    msg = str(e)
    return any(m in msg for m in _DEVICE_ERRORS)


def describe(phase: str, e: BaseException) -> str:
    """The message a failed request carries (no traceback: it may reach an HTTP client)."""
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return f"the request failed in the engine's {phase} phase: {type(e).__name__}" + (f": {first}" if first else "")


def copy_batch(batch: ScheduledBatch) -> ScheduledBatch:
    """A shallow copy (speculative verification edits a batch's prefill lists in place)."""
    return ScheduledBatch(list(batch.decodes), list(batch.prefills), list(batch.prefill_lens), batch.num_preempted)


def split_by_request(batch: ScheduledBatch) -> Dict[Request, ScheduledBatch]:
    """One sub-batch per request (all of its scheduled sequences), in batch order."""
    subs: Dict[Request, ScheduledBatch] = {}
    for s in batch.decodes:
        if not s.is_finished:
            subs.setdefault(s.request, ScheduledBatch()).decodes.append(s)
    for s, n in zip(batch.prefills, batch.prefill_lens):
        if not s.is_finished:
            sub = subs.setdefault(s.request, ScheduledBatch())
            sub.prefills.append(s)
            sub.prefill_lens.append(n)
    return subs


class FaultIsolation:
    """probe(batch): the step's work for a batch, advancing nothing (raises as the step did);
    phase(): the phase the last probe was in when it raised; fail(request, message): finish a
    request with finish_reason "error" and free its KV."""

    def __init__(self, probe: Callable[[ScheduledBatch], object], phase: Callable[[], str],
                 fail: Callable[[Request, str], None]):
        self.probe, self.phase, self.fail = probe, phase, fail
        self.num_failed_requests = 0

    def recover(self, batch: ScheduledBatch, error: Exception, phase: str) -> List[Request]:
        """batch's step raised `error` in `phase` before advancing any sequence. Fails the
        requests responsible and returns them; re-raises `error` when it is not attributable."""
        if is_fatal(error):
            raise error
        subs = split_by_request(batch)
        culprits: List[Tuple[Request, str]] = []
        innocent = 0        # requests whose work ran through the failed phase without error
        attributed = True   # every probe error names its request (an injected fault)
        for req, sub in subs.items():
            try:
                self.probe(sub)
            except Exception as e:  # noqa: BLE001 - any error of a lone request is that request's
                if is_fatal(e):
                    raise
                culprits.append((req, describe(self.phase(), e)))
                attributed &= isinstance(e, InjectedFault) and e.request_id == req.request_id
            else:   # a prefill chunk that samples nothing says nothing about a fault in sampling
                innocent += PHASES.index(self.phase()) >= PHASES.index(phase)
        if not culprits:
            log.error("llmkern engine: a step failed in its %s phase and no request reproduces it alone", phase)
            raise error
        if len(culprits) > 1 and not innocent and not attributed:
            log.error("llmkern engine: a step failed in its %s phase and every request of it fails alone too", phase)
            raise error
        log.warning("llmkern engine: step failed in its %s phase (%s: %s); failing %d of %d request(s): %s",
                    phase, type(error).__name__, str(error)[:200], len(culprits), len(subs),
                    ", ".join(r.request_id for r, _ in culprits),
                    exc_info=None if isinstance(error, InjectedFault) else error)
        for req, why in culprits:
            self.fail(req, why)
        self.num_failed_requests += len(culprits)
        return [r for r, _ in culprits]

    def blame(self, req: Request, error: Exception, phase: str) -> None:
        """A fault in one sequence's own work (stop checks, detokenising): its request fails."""
        if is_fatal(error):
            raise error
        log.warning("llmkern engine: request %s failed in the %s phase (%s: %s)", req.request_id, phase,
                    type(error).__name__, str(error)[:200], exc_info=None if isinstance(error, InjectedFault) else error)
        self.fail(req, describe(phase, error))
        self.num_failed_requests += 1
