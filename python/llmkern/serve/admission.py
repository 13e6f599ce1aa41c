"""Admission control: a bounded queue (requests and prompt tokens waiting to start) and an SLO
mode that predicts a new request's time to first token from the prefill work ahead of it and the
engine's measured prefill rate, refusing early (429 + Retry-After) what would miss the target so
that the admitted requests meet it."""
from __future__ import annotations

import math
from typing import Optional

from .config import ServeConfig
from .errors import APIError


class Admission:
    def __init__(self, cfg: ServeConfig, loop, metrics=None):
        self.cfg, self.loop, self.metrics = cfg, loop, metrics

    def predicted_ttft_s(self, num_tokens: int) -> Optional[float]:
        """Prefill tokens ahead (queued and in progress) plus this request's, over the measured
        prefill rate; None before the engine has measured one."""
        st, _, pending_tok = self.loop.load()
        if not st.prefill_tok_s:
            return None
        return (st.prefill_tokens_pending + pending_tok + num_tokens) / st.prefill_tok_s

    def check(self, num_requests: int, num_tokens: int) -> None:
        """Raise a 429 APIError if these requests may not join the queue now."""
        c = self.cfg
        st, pending_req, pending_tok = self.loop.load()
        queued, queued_tok = st.num_waiting + pending_req, st.prefill_tokens_pending + pending_tok
        rate = st.prefill_tok_s

        def retry_after(tokens: int) -> str:
            return str(max(1, math.ceil(tokens / rate))) if rate else "1"

        if c.max_queued_requests is not None and queued + num_requests > c.max_queued_requests:
            self._refuse("queue_full", f"the queue is full ({queued} requests waiting, limit "
                                       f"{c.max_queued_requests}); retry later", retry_after(queued_tok))
        if c.max_queued_tokens is not None and queued_tok + num_tokens > c.max_queued_tokens:
            self._refuse("queue_tokens_full", f"the queue holds {queued_tok} prompt tokens (limit "
                                              f"{c.max_queued_tokens}); retry later", retry_after(queued_tok))
        if c.slo_ttft_ms is not None and rate:
            ttft = (queued_tok + num_tokens) / rate
            if ttft * 1e3 > c.slo_ttft_ms:
                self._refuse("slo", f"predicted time to first token {ttft * 1e3:.0f} ms exceeds the server's "
                                    f"target of {c.slo_ttft_ms:.0f} ms; retry later", retry_after(queued_tok))

    def _refuse(self, reason: str, msg: str, retry_after: str) -> None:
        if self.metrics is not None:
            self.metrics.on_reject(reason)
        raise APIError(429, msg, code=reason, headers={"Retry-After": retry_after})
