"""ModelRunner: a scheduled batch -> flat input tensors + attention metadata -> model -> logits of
the rows that sample. Host-side preparation is vectorised per sequence (numpy), never per token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from ..layers.attention import AttnMetadata
from ..models.llama import LlamaForCausalLM
from .cuda_graphs import DecodeGraphs
from .kv_cache_manager import Caches
from .scheduler import ScheduledBatch
from .sequence import Sequence


def block_table(seqs: List[Sequence]) -> np.ndarray:
    """int32 [len(seqs), most blocks]: each sequence's block ids, zero-padded."""
    width = max(len(s.block_ids) for s in seqs)
    bt = np.zeros((len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        bt[i, :len(s.block_ids)] = s.block_ids
    return bt


@dataclass
class StepInputs:
    """One step's flat model inputs, prepared once per step."""
    input_ids: torch.Tensor        # [T]
    positions: torch.Tensor        # [T]
    meta: AttnMetadata
    sample_rows: torch.Tensor      # rows of the output whose logits are sampled
    sample_seqs: List[Sequence]    # the sequence of each sampled row


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, caches: Caches, block_size: int,
                 graphs: Optional[DecodeGraphs] = None):
        self.model = model
        self.caches = caches
        self.block_size = block_size
        self.device = model.device
        self.graphs = graphs  # CUDA graphs of decode-only steps (GPU), or None

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        bs = self.block_size
        ids: List[int] = []
        pos_parts, slot_parts = [], []
        sample_rows: List[int] = []
        sample_seqs: List[Sequence] = []
        meta = AttnMetadata(slot_mapping=None)

        nd = len(batch.decodes)
        if nd:
            pos = np.fromiter((s.num_computed_tokens for s in batch.decodes), dtype=np.int64, count=nd)
            ids.extend(s.token_ids[s.num_computed_tokens] for s in batch.decodes)
            last_blk = np.fromiter((s.block_ids[s.num_computed_tokens // bs] for s in batch.decodes),
                                   dtype=np.int64, count=nd)
            pos_parts.append(pos)
            slot_parts.append(last_blk * bs + pos % bs)
            meta.num_decode = nd
            meta.decode_seqlens = self._tensor((pos + 1).astype(np.int32))
            meta.decode_positions = self._tensor(pos.astype(np.int32))
            meta.decode_block_table = self._tensor(block_table(batch.decodes))
            sample_rows.extend(range(nd))
            sample_seqs.extend(batch.decodes)

        if batch.prefills:
            cu_q, cu_k = [0], [0]
            paged = False
            row = nd
            for s, n in zip(batch.prefills, batch.prefill_lens):
                start = s.num_computed_tokens
                toks = s.token_ids[start:start + n]
                if len(toks) < n:  # speculative verification: the last token, then the drafts
                    toks = toks + s.spec_token_ids[:n - len(toks)]
                ids.extend(toks)
                p = np.arange(start, start + n, dtype=np.int64)
                pos_parts.append(p)
                blocks = np.asarray(s.block_ids, dtype=np.int64)
                slot_parts.append(blocks[p // bs] * bs + p % bs)
                cu_q.append(cu_q[-1] + n)
                cu_k.append(cu_k[-1] + start + n)
                paged |= start > 0
                row += n
                # Rows from the last known token on predict a next token: one row when a prompt
                # completes, 1 + drafts rows for a speculative verification chunk.
                m = start + n - max(start, s.num_tokens - 1)
                if m > 0:
                    sample_rows.extend(range(row - m, row))
                    sample_seqs.extend([s] * m)
            meta.num_prefill_tokens = cu_q[-1]
            meta.prefill_cu_q = self._tensor(np.asarray(cu_q, dtype=np.int32))
            meta.prefill_max_q = max(batch.prefill_lens)
            if paged:
                meta.prefill_cu_k = self._tensor(np.asarray(cu_k, dtype=np.int32))
                meta.prefill_max_k = int(np.max(np.diff(cu_k)))
                meta.prefill_block_table = self._tensor(block_table(batch.prefills))

        input_ids = self._tensor(np.asarray(ids, dtype=np.int64))
        positions = self._tensor(np.concatenate(pos_parts))
        meta.slot_mapping = self._tensor(np.concatenate(slot_parts))
        rows = self._tensor(np.asarray(sample_rows, dtype=np.int64))
        return StepInputs(input_ids, positions, meta, rows, sample_seqs)

    def execute(self, inputs: StepInputs) -> Tuple[Optional[torch.Tensor], List[Sequence]]:
        """fp32 logits [num sampling rows, vocab] and the sequences they belong to."""
        input_ids, positions, meta, rows, sample_seqs = (inputs.input_ids, inputs.positions, inputs.meta,
                                                         inputs.sample_rows, inputs.sample_seqs)
        if (self.graphs is not None and not meta.num_prefill_tokens and meta.num_decode
                and self.graphs.fits(meta.num_decode, meta.decode_block_table.shape[1])):
            logits = self.graphs.run(input_ids, positions, meta)
            if logits is not None:
                return logits, sample_seqs
        hidden = self.model.forward(input_ids, positions, meta, self.caches)
        if not sample_seqs:
            return None, []
        return self.model.compute_logits(hidden, rows), sample_seqs

    def run_prompts(self, token_lists: List[List[int]]) -> Tuple[torch.Tensor, np.ndarray]:
        """Prefill-only pass for embedding and scoring: every list is a whole sequence from position
        0, attended densely on its own fresh K/V; no KV block is allocated or written (slot -1).
        Returns the final hidden states [sum of lengths, hidden] and the cumulative lengths."""
        lens = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
        cu = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=cu[1:])
        ids = self._tensor(np.fromiter((t for toks in token_lists for t in toks), dtype=np.int64, count=int(cu[-1])))
        positions = self._tensor(np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], lens))
        meta = AttnMetadata(slot_mapping=self._tensor(np.full(int(cu[-1]), -1, dtype=np.int64)),
                            num_prefill_tokens=int(cu[-1]), prefill_cu_q=self._tensor(cu.astype(np.int32)),
                            prefill_max_q=int(lens.max()) if len(lens) else 0)
        return self.model.forward(ids, positions, meta, self.caches), cu
