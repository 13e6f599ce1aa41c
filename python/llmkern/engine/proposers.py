"""Draft proposers for speculative decoding.

- NgramProposer (prompt lookup): the tokens that followed the most recent earlier occurrence of
  the longest matching suffix n-gram of the sequence's own context. No model, no probabilities
  (verification treats its drafts as one-hot).
- ModelProposer: k autoregressive steps of a draft model, batched over the sequences being
  verified. Two flavours:
  * "draft": a separate smaller model. Its KV lives in its own cache tensors addressed by the
    target's block ids (the KV-cache manager copies those layers along with the target's on
    swap and offload), and it runs over every token row the target runs (the mirror pass), so
    its cache always covers exactly the target's computed positions: prefix hits, preemption and
    rollback need nothing extra.
  * "early_exit": the target's first N layers + final norm + LM head, sharing the target's
    weights and its cache layers 0..N-1. Sharing is exact: the KV of layer i < N at a position
    depends only on the tokens up to it, and every position the target keeps is written by the
    target's own forward (draft writes land only on the positions the verification rewrites).

Draft sampling follows the request: greedy rows take the argmax; sampled rows draw from the
draft's distribution after the request's temperature / top-k / top-p / min-p, and that
distribution is returned for the verification (speculative sampling is exact for any draft
distribution, the closer to the target's the more drafts pass)."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from ..layers.attention import AttnMetadata
from ..models.llama import LlamaForCausalLM
from ..ops.sampling import sampling_from_probs
from .model_runner import block_table
from .row_filters import RowFilters, filtered_probs
from .sampler import greedy_tokens
from .sequence import Sequence


# -- sampling the draft's distribution -------------------------------------------------------------
def sample_rows(probs: torch.Tensor, gens: Seq[Optional[torch.Generator]],
                default: torch.Generator) -> torch.Tensor:
    """One token per row of probs; rows with their own generator draw from it alone (so a seeded
    request's draws do not depend on the rest of the batch)."""
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    shared = [i for i, g in enumerate(gens) if g is None]
    if shared:
        out[shared] = sampling_from_probs(probs[shared], generator=default).to(torch.int64)
    for i, g in enumerate(gens):
        if g is not None:
            out[i] = sampling_from_probs(probs[i:i + 1], generator=g)[0].to(torch.int64)
    return out


# -- n-gram -----------------------------------------------------------------------------------
def ngram_lookup(tokens: np.ndarray, nmin: int, nmax: int, k: int) -> List[int]:
    """Up to k tokens following the most recent earlier occurrence of the longest suffix of
    `tokens` of length nmax..nmin; [] when none occurs. O(len(tokens)) per n, vectorised."""
    L = len(tokens)
    for n in range(min(nmax, L - 1), nmin - 1, -1):
        suffix = tokens[L - n:]
        cand = np.flatnonzero(tokens[:L - n] == suffix[0])  # starts i with i + n <= L - 1
        for j in range(1, n):
            if not cand.size:
                break
            cand = cand[tokens[cand + j] == suffix[j]]
        if cand.size:
            i = int(cand[-1]) + n
            return tokens[i:i + k].tolist()
    return []


class NgramProposer:
    needs_model = False

    def __init__(self, nmin: int, nmax: int):
        self.nmin, self.nmax = nmin, nmax

    def propose(self, seq: Sequence, k: int) -> List[int]:
        return ngram_lookup(np.asarray(seq.token_ids, dtype=np.int64), self.nmin, self.nmax, k)


# -- model drafts -------------------------------------------------------------------------------
def early_exit_model(target: LlamaForCausalLM, num_layers: int) -> LlamaForCausalLM:
    """The target's first num_layers layers + its final norm and LM head (shared weights)."""
    cfg = dataclasses.replace(target.config, num_layers=num_layers)
    return LlamaForCausalLM(cfg, target.embed, target.layers[:num_layers], target.norm, target.lm_head)


class ModelProposer:
    needs_model = True

    def __init__(self, model: LlamaForCausalLM, caches: list, block_size: int, mirror: bool):
        self.model = model
        self.caches = caches          # the draft's layers (shared with the target for early exit)
        self.block_size = block_size
        self.mirror = mirror          # run over the target's rows too (separate draft model)
        self.device = model.device

    def _t(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    def mirror_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata) -> None:
        """Write the draft's KV for the same token rows as the target's step (same metadata)."""
        self.model.forward(input_ids, positions, meta, self.caches)

    def propose(self, seqs: List[Sequence], ks: List[int], default_gen: torch.Generator
                ) -> Tuple[List[List[int]], List[Optional[torch.Tensor]]]:
        """ks[i] drafts for seqs[i] (each in decode state, slots allocated for 1 + ks[i] tokens).
        Returns the drafts and, for sampled requests, the draft distributions [ks[i], V]."""
        bs = self.block_size
        b = len(seqs)
        bt = block_table(seqs)
        nc = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=b)
        ks_a = np.asarray(ks)
        drafts: List[List[int]] = [[] for _ in seqs]
        probs: List[list] = [[] for _ in seqs]
        cur = [s.token_ids[-1] for s in seqs]
        bt_t = self._t(bt)
        for j in range(max(ks)):
            act = np.flatnonzero(ks_a > j)
            pos = nc[act] + j
            slots = bt[act, pos // bs].astype(np.int64) * bs + pos % bs
            meta = AttnMetadata(slot_mapping=self._t(slots), num_decode=len(act),
                                decode_seqlens=self._t((pos + 1).astype(np.int32)),
                                decode_block_table=bt_t if len(act) == b else bt_t[self._t(act)])
            ids = self._t(np.asarray([cur[i] for i in act], dtype=np.int64))
            hidden = self.model.forward(ids, self._t(pos), meta, self.caches)
            logits = self.model.compute_logits(hidden)
            nxt = greedy_tokens(logits)
            sampled = [r for r, i in enumerate(act) if not seqs[i].params.greedy]
            if sampled:
                x = logits[sampled]
                p = filtered_probs(x, RowFilters.of([seqs[act[r]].params for r in sampled], x))
                nxt[sampled] = sample_rows(p, [seqs[act[r]].generator for r in sampled], default_gen)
                for r, row in zip(sampled, p):
                    probs[act[r]].append(row)
            for r, t in zip(act.tolist(), nxt.tolist()):
                drafts[r].append(t)
                cur[r] = t
        return drafts, [torch.stack(p) if p else None for p in probs]
