"""Sampler: logits of the sampling rows -> next token per sequence.

Order per row: min_tokens masking (EOS/stop ids), penalties, then greedy argmax (temperature 0)
or temperature + top-k / top-p / min-p sampling through the sampling kernels (the filters of
row_filters.py, which speculative decoding shares). Requests with a seed draw from their own
generator (one kernel call each, so their draws do not depend on the rest of the batch); the
others share the engine's generator in one call."""
from __future__ import annotations

from typing import List, Optional

import torch

from ..ops.sampling import (
    apply_penalties,
    min_p_sampling_from_probs,
    sampling_from_logits,
    top_k_top_p_sampling_from_logits,
)
from .row_filters import RowFilters, filtered_probs
from .sequence import Sequence


def greedy_tokens(logits: torch.Tensor, token_bitmask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Row argmax (lowest index on ties) as int64: the sampling kernel at temperature 0, a single
    pass on llmkern's threads (5x torch.argmax for 32 x 49k fp32 logits on 2 cores). With a token
    bitmask: the argmax among the allowed tokens."""
    return sampling_from_logits(logits, temperature=0.0, seed=0, offset=0, token_bitmask=token_bitmask).long()


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: List[int], device: torch.device, seed: int):
        self.vocab_size = vocab_size
        self.eos = list(eos_token_ids)
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: List[Sequence],
                 token_bitmask: Optional[torch.Tensor] = None) -> List[int]:
        """Next token of each sequence (row i of logits is seqs[i]'s). token_bitmask: int32
        [len(seqs), ceil(V / 32)] allowed tokens per row on the logits' device, or None (no
        grammar). A row whose mask allows no token with mass gets an arbitrary token (the
        kernels' degenerate row): the caller must not send empty masks."""
        params = [s.params for s in seqs]
        if all(p.greedy and not p.has_penalties and not p.min_tokens and not p.logit_bias for p in params):
            return greedy_tokens(logits, token_bitmask).tolist()
        self.mask_min_tokens(logits, seqs)
        self.add_logit_bias(logits, seqs)
        self._apply_penalties(logits, seqs)
        out = greedy_tokens(logits, token_bitmask)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            shared = [i for i in rows if seqs[i].generator is None]
            if shared:
                out[shared] = self._sample(logits, shared, seqs, self.generator, token_bitmask).to(out.dtype)
            for i in rows:
                g = seqs[i].generator
                if g is not None:
                    out[i] = self._sample(logits, [i], seqs, g, token_bitmask)[0].to(out.dtype)
        return out.tolist()

    def mask_min_tokens(self, logits: torch.Tensor, seqs: List[Sequence], offsets: Optional[List[int]] = None,
                        rows: Optional[List[int]] = None) -> None:
        """Logits row rows[i] (default i) predicts output token seqs[i].num_output_tokens + offsets[i]
        (default 0; a speculative chunk's rows have offsets 0, 1, ...). While that token is below
        min_tokens, every EOS id and stop_token_id is banned, whether or not ignore_eos is set (as
        vLLM and HF's min_new_tokens do)."""
        for i, s in enumerate(seqs):
            p = s.params
            if p.min_tokens and s.num_output_tokens + (offsets[i] if offsets else 0) < p.min_tokens:
                banned = [t for t in (*p.stop_token_ids, *self.eos) if t < logits.shape[1]]
                if banned:
                    logits[rows[i] if rows else i, banned] = float("-inf")

    @staticmethod
    def add_logit_bias(logits: torch.Tensor, seqs: List[Sequence]) -> None:
        """OpenAI's logit_bias: added to the raw logits (before penalties and temperature)."""
        for i, s in enumerate(seqs):
            bias = s.params.logit_bias
            if bias:
                ids = torch.tensor(list(bias), dtype=torch.int64, device=logits.device)
                logits[i, ids] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)

    def _apply_penalties(self, logits: torch.Tensor, seqs: List[Sequence]) -> None:
        rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        if not rows:
            return
        dev = logits.device

        def padded(lists):
            width = max(1, max(len(x) for x in lists))
            t = torch.full((len(lists), width), -1, dtype=torch.int64)
            for j, x in enumerate(lists):
                t[j, :len(x)] = torch.tensor(x, dtype=torch.int64)
            return t.to(dev)

        ps = [seqs[i].params for i in rows]
        sub = logits[rows]
        apply_penalties(
            sub, repetition_penalties=torch.tensor([p.repetition_penalty for p in ps], dtype=torch.float32, device=dev),
            frequency_penalties=torch.tensor([p.frequency_penalty for p in ps], dtype=torch.float32, device=dev),
            presence_penalties=torch.tensor([p.presence_penalty for p in ps], dtype=torch.float32, device=dev),
            output_token_ids=padded([seqs[i].output_token_ids for i in rows]),
            prompt_token_ids=padded([seqs[i].token_ids[:seqs[i].num_prompt_tokens] for i in rows]))
        logits[rows] = sub

    def _sample(self, logits: torch.Tensor, rows: List[int], seqs: List[Sequence],
                generator: Optional[torch.Generator], token_bitmask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = logits[rows]
        m = token_bitmask[rows] if token_bitmask is not None else None
        f = RowFilters.of([seqs[i].params for i in rows], x)
        if f.use_min_p:
            # min-p is left to the draw kernel: it keeps the set filtered_probs' min-p step keeps
            return min_p_sampling_from_probs(filtered_probs(x, f, min_p=False, token_bitmask=m), f.min_p,
                                             generator=generator)
        if f.use_top_k or f.use_top_p:
            return top_k_top_p_sampling_from_logits(x, f.top_k, f.top_p, temperature=f.temperature,
                                                    generator=generator, token_bitmask=m)
        return sampling_from_logits(x, temperature=f.temperature, generator=generator, token_bitmask=m)
