"""Output assembly: a request's RequestOutput (stream deltas with stop-string hold-back), its
metrics, and the log-probabilities recorded per step."""
from __future__ import annotations

from typing import List

import torch

from .detokenizer import stop_holdback
from .metrics import inter_token_latencies
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .sequence import Request, Sequence


def logprob_entries(logp: torch.Tensor, seqs: List[Sequence], toks: List[int]) -> list:
    """Per sequence, the entry its logprobs get: (chosen token's logprob, top-k [(id, logprob)])."""
    kmax = max(s.params.logprobs for s in seqs)
    top_v, top_i = logp.topk(kmax, dim=-1) if kmax else (None, None)
    chosen = logp[torch.arange(len(toks)), torch.tensor(toks)].tolist()
    out = []
    for r, (s, lp) in enumerate(zip(seqs, chosen)):
        k = s.params.logprobs
        out.append((lp, list(zip(top_i[r, :k].tolist(), top_v[r, :k].tolist())) if k else []))
    return out


def request_metrics(req: Request) -> RequestMetrics:
    s0 = req.seqs[0]
    firsts = [s.first_token_time for s in req.seqs if s.first_token_time is not None]
    itl = inter_token_latencies(s0.token_times)
    kvb, kvs = req.kv_transfer or (0, 0.0)
    return RequestMetrics(
        arrival_time=req.arrival_time, first_scheduled_time=req.first_scheduled_time,
        first_token_time=min(firsts) if firsts else None,
        finish_time=max((s.finish_time or 0.0) for s in req.seqs) if req.finished else None,
        num_prompt_tokens=len(req.prompt_token_ids),
        num_output_tokens=sum(s.num_output_tokens for s in req.seqs),
        num_cached_prompt_tokens=s0.prompt_cache_hit_tokens,
        num_preemptions=sum(s.num_preemptions for s in req.seqs), inter_token_latencies=itl,
        kv_transfer_bytes=kvb, kv_transfer_s=kvs)

def make_output(req: Request, finished: bool) -> RequestOutput:
    """The RequestOutput of req now: full texts, and for streaming the tokens and text new since
    the last output (text that may still turn out to be a stop string is held back)."""
    outs = []
    for s in req.seqs:
        new_ids = s.output_token_ids[s.stream_offset:]
        s.stream_offset = s.num_output_tokens
        visible = len(s.output_text)
        if not s.is_finished and s.params.stop_list and not s.params.include_stop_str_in_output:
            visible -= stop_holdback(s.output_text, s.params.stop_list)
        delta = s.output_text[s.text_sent:visible] if visible > s.text_sent else ""
        s.text_sent = max(s.text_sent, visible)
        lps = s.logprobs
        outs.append(CompletionOutput(s.index, s.output_text[:visible], s.output_token_ids, s.finish_reason,
                                     s.stop_reason, delta, new_ids, lps,
                                     None if lps is None else lps[len(lps) - len(new_ids):]))
    return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished,
                         request_metrics(req), error=req.error,
                         kv_transfer_params=req.kv_transfer_params if finished else None,
                         prompt_logprobs=req.prompt_logprobs)
