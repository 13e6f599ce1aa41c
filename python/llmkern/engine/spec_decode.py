"""Speculative decoding: drafts are proposed, verified by one target forward, accepted or rolled back.

Per engine step (hooks in Engine.step; Scheduler.schedule and ModelRunner.prepare read
`seq.spec_token_ids`):
  1. before_schedule: every running sequence in decode state gets up to k drafts in
     `seq.spec_token_ids` (n-gram: the tokens themselves; model proposers: k placeholders, drafted
     after scheduling). k is capped by max_tokens and max_model_len, and speculation is skipped
     for requests with penalties (their logits depend on each emitted token) and in steps where
     more sequences decode than `disable_by_batch_size`.
  2. The scheduler runs such a sequence as a chunk of 1 + k tokens ([last token] + drafts); the
     drafts count against the token budget and are dropped first when the budget or the KV pool
     is short.
  3. before_forward: model proposers draft for the scheduled chunks; mirror: once the step's
     inputs are prepared, the separate draft model runs over the same rows to keep its cache in
     step with the target's.
  4. The target forward returns logits for all 1 + k rows of each chunk (paged varlen attention,
     causal from the cached prefix). verify: greedy requests accept drafts while they equal the
     argmax and then emit the argmax; sampled requests go through chain_speculative_sampling
     (draft distributions from a draft model, one-hot for n-gram drafts). Either way a
     rejection emits the corrected token and full acceptance emits a bonus token.
  5. commit: emitted tokens are appended one at a time with the stop checks (stop strings, stop
     ids, EOS, max_tokens stay exact; tokens after a stop are dropped); the last token and the
     accepted drafts become computed. The engine then rolls the KV cache back past them
     (KVCacheManager.truncate frees the rejected slots' blocks) and indexes only blocks whose
     tokens are final in the prefix cache."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..ops.sampling import chain_speculative_sampling
from .proposers import ModelProposer, NgramProposer, early_exit_model
from .row_filters import RowFilters, filtered_probs
from .sampler import Sampler, greedy_tokens
from .sequence import Sequence, SeqStatus
from .spec_config import SpecConfig

PENDING = -1  # placeholder draft of a model proposer, replaced after scheduling


@dataclass
class SpecMetrics:
    num_verified: int = 0        # (sequence, step) pairs that verified drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # accepted + corrected/bonus tokens
    draft_time: float = 0.0      # proposing (n-gram lookup, draft-model forwards)
    verify_time: float = 0.0     # target forward + acceptance of the steps that verified drafts
    num_spec_steps: int = 0
    num_disabled_steps: int = 0  # steps where the batch was too large to speculate

    def summary(self) -> dict:
        nv = max(self.num_verified, 1)
        return {
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "mean_accepted_length": self.num_emitted_tokens / nv if self.num_verified else 0.0,
            "draft_tokens": self.num_draft_tokens, "accepted_tokens": self.num_accepted_tokens,
            "verified": self.num_verified, "spec_steps": self.num_spec_steps,
            "disabled_steps": self.num_disabled_steps,
            "draft_time_s": self.draft_time, "verify_time_s": self.verify_time,
        }


def format_spec_summary(s: dict) -> str:
    return (f"speculative: acceptance {100 * s['acceptance_rate']:.1f}% "
            f"({s['accepted_tokens']}/{s['draft_tokens']} drafts), mean accepted length "
            f"{s['mean_accepted_length']:.2f} tok/verify, draft {s['draft_time_s']:.2f} s vs verify "
            f"{s['verify_time_s']:.2f} s, {s['spec_steps']} spec steps, {s['disabled_steps']} skipped (batch size)")


class SpecDecoder:
    """Built in two steps, because the KV cache is sized after the draft model is known:
    SpecDecoder(...) loads the draft model (kv_layers() says what it adds to the cache), then
    bind_caches(...) hands it its cache layers."""

    def __init__(self, cfg: SpecConfig, target, device: torch.device, dtype: torch.dtype,
                 max_model_len: int, sampler: Sampler):
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.sampler = sampler  # its generator draws for requests without their own; min_tokens mask
        self.k = cfg.num_speculative_tokens
        self.metrics = SpecMetrics()
        self.target = target
        self.draft_model = None
        mc = target.config
        if cfg.method == "draft":
            from ..models.loader import load_model

            self.draft_model, _ = load_model(cfg.model, dtype, device, cfg.load_format, seed=cfg.seed)
            dc = self.draft_model.config
            if dc.vocab_size != mc.vocab_size:
                raise ValueError(f"speculative.model: vocab_size {dc.vocab_size} differs from the target's "
                                 f"{mc.vocab_size} (the draft must share the tokenizer)")
            if dc.max_position_embeddings < max_model_len:
                raise ValueError(f"speculative.model: the draft allows {dc.max_position_embeddings} positions, "
                                 f"fewer than max_model_len {max_model_len}; lower max_model_len")
        elif cfg.method == "early_exit":
            n = cfg.num_layers if cfg.num_layers is not None else max(1, mc.num_layers // 2)
            if n >= mc.num_layers:
                raise ValueError(f"speculative.num_layers: expected fewer than the target's {mc.num_layers} "
                                 f"layers, got {n}")
            self.draft_model = early_exit_model(target, n)
        self.proposer = None
        self._pending: List[Sequence] = []
        self._verify: List[Sequence] = []
        self._draft_probs: Dict[int, torch.Tensor] = {}
        self._t_draft_end = 0.0

    # -- construction -------------------------------------------------------------------------------
    def kv_layers(self) -> List[Tuple[int, int, int]]:
        """(num_layers, num_kv_heads, head_dim) a separate draft model adds to the KV cache (its
        layers follow the target's and share its block ids); early exit shares the target's."""
        if self.cfg.method != "draft":
            return []
        return [self.draft_model.config.kv_layout]

    def bind_caches(self, caches: list, block_size: int) -> None:
        """The per-layer caches of the whole KV cache (target layers first)."""
        L = self.target.config.num_layers
        if self.cfg.method == "ngram":
            self.proposer = NgramProposer(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
        elif self.cfg.method == "draft":
            self.proposer = ModelProposer(self.draft_model, caches[L:], block_size, mirror=True)
        else:
            n = self.draft_model.config.num_layers
            self.proposer = ModelProposer(self.draft_model, caches[:n], block_size, mirror=False)

    # -- 1. before scheduling ------------------------------------------------------------------
    def before_schedule(self, running: List[Sequence]) -> None:
        t0 = time.perf_counter()
        for s in self._pending:  # leftovers of a step that was never run
            s.spec_token_ids = []
        self._pending = []
        decoding = [s for s in running if s.status is SeqStatus.RUNNING
                    and s.num_computed_tokens == s.num_tokens - 1]
        if not decoding:
            return
        cap = self.cfg.disable_by_batch_size
        if cap is not None and len(decoding) > cap:
            self.metrics.num_disabled_steps += 1
            return
        for s in decoding:
            p = s.params
            k = min(self.k, self.max_model_len - s.num_tokens)
            if p.max_tokens is not None:
                k = min(k, p.max_tokens - s.num_output_tokens - 1)
            if k <= 0 or p.has_penalties:
                continue
            drafts = self.proposer.propose(s, k) if not self.proposer.needs_model else [PENDING] * k
            if drafts:
                s.spec_token_ids = drafts
                self._pending.append(s)
        self.metrics.draft_time += time.perf_counter() - t0

    # -- 3. after scheduling, before the target forward ---------------------------------------------
    def before_forward(self, batch) -> None:
        t0 = time.perf_counter()
        verify = []
        for s, n in zip(batch.prefills, batch.prefill_lens):
            extra = s.num_computed_tokens + n - s.num_tokens
            if extra > 0:
                assert extra == len(s.spec_token_ids), "scheduler: drafts and chunk length disagree"
                verify.append(s)
        chosen = {s.seq_id for s in verify}
        for s in self._pending:
            if s.seq_id not in chosen:  # preempted or out of budget: plain decode (or none)
                s.spec_token_ids = []
        self._pending = []
        self._verify = verify
        self._draft_probs = {}
        if verify and self.proposer.needs_model:
            drafts, probs = self.proposer.propose(verify, [len(s.spec_token_ids) for s in verify],
                                                  self.sampler.generator)
            for s, d, p in zip(verify, drafts, probs):
                s.spec_token_ids = d
                if p is not None:
                    self._draft_probs[s.seq_id] = p
        now = time.perf_counter()
        self.metrics.draft_time += now - t0
        self._t_draft_end = now

    def mirror(self, inputs) -> None:
        """A separate draft model writes its KV for the step's token rows (the runner's prepared
        inputs, the same the target runs on)."""
        if not (self.proposer.needs_model and self.proposer.mirror):
            return
        t0 = time.perf_counter()
        self.proposer.mirror_forward(inputs.input_ids, inputs.positions, inputs.meta)
        now = time.perf_counter()
        self.metrics.draft_time += now - t0
        self._t_draft_end = now

    # -- 4. verification --------------------------------------------------------------------------
    def verify(self, batch, logits: Optional[torch.Tensor], sample_seqs: List[Sequence],
               token_bitmask: Optional[torch.Tensor] = None
               ) -> Tuple[Optional[torch.Tensor], List[Sequence], Dict[Sequence, List[int]]]:
        """Splits the step's logits: returns (logits and sequences of the plain sampling rows,
        {verified sequence: emitted tokens}). Verified chunks leave batch.prefills.
        token_bitmask: int32 [logits rows, words] grammar masks, row i for logits row i (a verified
        chunk's rows: one per position); the plain rows' masks stay the caller's to pass on."""
        if not self._verify:
            return logits, sample_seqs, {}
        vset = {s.seq_id for s in self._verify}
        keep = [i for i, s in enumerate(batch.prefills) if s.seq_id not in vset]
        batch.prefill_lens[:] = [batch.prefill_lens[i] for i in keep]
        batch.prefills[:] = [batch.prefills[i] for i in keep]
        plain_rows, spans = [], {}
        i = 0
        while i < len(sample_seqs):
            s = sample_seqs[i]
            if s.seq_id in vset:
                n = len(s.spec_token_ids) + 1
                spans[s] = i
                i += n
            else:
                plain_rows.append(i)
                i += 1
        # Row j of a chunk predicts output token n_out + j.
        chunk = [(s, j) for s in spans for j in range(len(s.spec_token_ids) + 1)]
        self.sampler.mask_min_tokens(logits, [s for s, _ in chunk], [j for _, j in chunk],
                                     [spans[s] + j for s, j in chunk])
        out: Dict[Sequence, List[int]] = {}
        greedy = [s for s in spans if s.params.greedy]
        if greedy:
            amax = greedy_tokens(logits, token_bitmask).tolist()
            for s in greedy:
                r0, d = spans[s], s.spec_token_ids
                a = 0
                while a < len(d) and d[a] == amax[r0 + a]:
                    a += 1
                out[s] = d[:a] + [amax[r0 + a]]
        sampled = [s for s in spans if not s.params.greedy]
        if sampled:
            out.update(self._verify_sampled(logits, spans, sampled, token_bitmask))
        m = self.metrics
        m.num_spec_steps += 1
        for s, toks in out.items():
            m.num_verified += 1
            m.num_draft_tokens += len(s.spec_token_ids)
            m.num_accepted_tokens += len(toks) - 1
            m.num_emitted_tokens += len(toks)
        self._verify = []
        if plain_rows:
            idx = torch.tensor(plain_rows, dtype=torch.int64, device=logits.device)
            plain = logits.index_select(0, idx)
        else:
            plain = None
        return plain, [sample_seqs[i] for i in plain_rows], out

    def _verify_sampled(self, logits, spans, seqs, token_bitmask=None) -> Dict[Sequence, List[int]]:
        # One kernel call per (draft count, kind of draft, generator): rows of a call share n.
        groups = defaultdict(list)
        for s in seqs:
            gen_key = id(s.generator) if s.generator is not None else None
            groups[(len(s.spec_token_ids), s.seq_id in self._draft_probs, gen_key)].append(s)
        out = {}
        dev = logits.device
        for (n, has_q, _), group in groups.items():
            rows = torch.tensor([spans[s] + j for s in group for j in range(n + 1)], dtype=torch.int64, device=dev)
            params = [s.params for s in group for _ in range(n + 1)]
            x = logits.index_select(0, rows)
            m = token_bitmask.index_select(0, rows) if token_bitmask is not None else None
            p = filtered_probs(x, RowFilters.of(params, x), token_bitmask=m).view(len(group), n + 1, -1)
            ids = torch.tensor([s.spec_token_ids for s in group], dtype=torch.int64, device=dev)
            q = torch.stack([self._draft_probs[s.seq_id] for s in group]).float().contiguous() if has_q else None
            gen = group[0].generator if group[0].generator is not None else self.sampler.generator
            # p is already the masked target; the mask also makes the kernel reject disallowed drafts
            mv = m.view(len(group), n + 1, -1) if m is not None else None
            toks, _, emitted = chain_speculative_sampling(q, ids, p, generator=gen, token_bitmask=mv)
            toks, emitted = toks.tolist(), emitted.tolist()
            for s, row, e in zip(group, toks, emitted):
                out[s] = row[:e + 1]
        return out

    # -- 5. commit ------------------------------------------------------------------------------
    def commit(self, results: Dict[Sequence, List[int]], now: float, check_stop) -> List[Sequence]:
        """Appends the emitted tokens with the stop checks; returns the sequences. Their KV past
        num_computed_tokens (rejected drafts) is the caller's to roll back."""
        touched = []
        for seq, toks in results.items():
            seq.spec_token_ids = []
            # The last token and the accepted drafts (all but the final emitted token) now have
            # their final KV in the cache.
            seq.num_computed_tokens += len(toks)
            for t in toks:
                seq.append_token(t, now)
                check_stop(seq, t, now)
                if seq.is_finished:  # its blocks are freed already; later tokens are dropped
                    break
            touched.append(seq)
        self.metrics.verify_time += time.perf_counter() - self._t_draft_end
        return touched
