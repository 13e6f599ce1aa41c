"""Sampler: logits of the sampling rows -> next token per sequence.

Order per row: min_tokens masking (EOS/stop ids), penalties, then greedy argmax (temperature 0)
or temperature + top-k / top-p / min-p sampling through the sampling kernels. Requests with a
seed draw from their own generator (one kernel call each, so their draws do not depend on the
rest of the batch); the others share the engine's generator in one call."""
from __future__ import annotations

from typing import List, Optional

import torch

from . import kernels as K
from .sequence import Sequence


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: List[int], device: torch.device, seed: int):
        self.vocab_size = vocab_size
        self.eos = list(eos_token_ids)
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: List[Sequence]) -> List[int]:
        params = [s.params for s in seqs]
        if all(p.greedy and not p.has_penalties and not p.min_tokens for p in params):
            return logits.argmax(dim=-1).tolist()
        self._mask_min_tokens(logits, seqs)
        self._apply_penalties(logits, seqs)
        out = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            shared = [i for i in rows if seqs[i].generator is None]
            if shared:
                out[shared] = self._sample(logits, shared, seqs, self.generator).to(out.dtype)
            for i in rows:
                g = seqs[i].generator
                if g is not None:
                    out[i] = self._sample(logits, [i], seqs, g)[0].to(out.dtype)
        return out.tolist()

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: List[Sequence]) -> None:
        for i, s in enumerate(seqs):
            p = s.params
            if p.min_tokens and s.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos)
                banned = [t for t in banned if t < logits.shape[1]]
                if banned:
                    logits[i, banned] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, seqs: List[Sequence]) -> None:
        V = logits.shape[1]
        for i, s in enumerate(seqs):
            p = s.params
            if not p.has_penalties:
                continue
            row = logits[i]
            out_ids = torch.tensor(s.output_token_ids, dtype=torch.int64, device=logits.device)
            if p.repetition_penalty != 1.0:  # HF semantics: over prompt and output tokens
                seen = torch.zeros(V, dtype=torch.bool, device=logits.device)
                seen[torch.tensor(s.token_ids, dtype=torch.int64, device=logits.device)] = True
                rp = p.repetition_penalty
                row.copy_(torch.where(seen, torch.where(row > 0, row / rp, row * rp), row))
            if out_ids.numel() and (p.frequency_penalty or p.presence_penalty):
                counts = torch.bincount(out_ids, minlength=V)[:V].to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def _sample(self, logits: torch.Tensor, rows: List[int], seqs: List[Sequence],
                generator: Optional[torch.Generator]) -> torch.Tensor:
        ps = [seqs[i].params for i in rows]
        x = logits[rows]
        temps = torch.tensor([p.temperature for p in ps], dtype=x.dtype, device=x.device)
        x = x / temps.unsqueeze(1)
        V = x.shape[1]
        top_k = [p.top_k if p.top_k > 0 else V for p in ps]
        top_p = [p.top_p for p in ps]
        min_p = [p.min_p for p in ps]
        use_k, use_p = any(k < V for k in top_k), any(q < 1.0 for q in top_p)
        if any(m > 0 for m in min_p):
            if use_k:
                x = K.top_k_mask_logits(x, torch.tensor(top_k, dtype=torch.int32, device=x.device))
            probs = torch.softmax(x, dim=-1)
            if use_p:
                probs = K.top_p_renorm_probs(probs, torch.tensor(top_p, dtype=torch.float32, device=x.device))
            return K.min_p_sampling_from_probs(probs, torch.tensor(min_p, dtype=torch.float32, device=x.device),
                                               generator=generator)
        if use_k or use_p:
            return K.top_k_top_p_sampling_from_logits(
                x, torch.tensor(top_k, dtype=torch.int32, device=x.device),
                torch.tensor(top_p, dtype=torch.float32, device=x.device), generator=generator)
        return K.sampling_from_logits(x, generator=generator)
