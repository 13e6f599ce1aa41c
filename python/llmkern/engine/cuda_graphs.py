"""CUDA graphs of decode-only steps (GPU; off with ``enforce_eager=True``).

A decode step runs ~10 small kernels per layer; on a GPU their launch cost, not the work, sets the
step time at small batches. Each padded batch size (1, 2, 4, 8, then multiples of 16) gets one graph
of model.forward + compute_logits over static input buffers, captured on first use; a step copies
its inputs into the buffers and replays. Padding rows write no KV (slot -1) and attend to one key
of block 0; their logits are dropped. The llmkern CUDA kernels allocate nothing and never
synchronise the host, which is what capture needs.

Every capture is checked once against the eager step on the same inputs; a graph whose logits
differ is discarded and that batch size runs eagerly from then on (with a warning)."""
from __future__ import annotations

import warnings
from typing import Dict, List, Optional, Tuple

import torch

from ..layers.attention import AttnMetadata


def _sizes(max_num_seqs: int) -> List[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


class DecodeGraphs:
    def __init__(self, model, caches, block_size: int, max_num_seqs: int, max_model_len: int):
        self.model, self.caches = model, caches
        self.sizes = _sizes(max_num_seqs)
        dev = model.device
        n = self.sizes[-1]
        width = -(-max_model_len // block_size)
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slots = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.seqlens = torch.ones(n, dtype=torch.int32, device=dev)
        self.table = torch.zeros((n, width), dtype=torch.int32, device=dev)
        self.graphs: Dict[int, Optional[Tuple[torch.cuda.CUDAGraph, torch.Tensor]]] = {}
        self.pool = None

    def fits(self, num_decode: int, table_width: int) -> bool:
        return num_decode <= self.sizes[-1] and table_width <= self.table.shape[1]

    def _forward(self, bs: int) -> torch.Tensor:
        meta = AttnMetadata(slot_mapping=self.slots[:bs], num_decode=bs, decode_seqlens=self.seqlens[:bs],
                            decode_block_table=self.table[:bs])
        hidden = self.model.forward(self.ids[:bs], self.pos[:bs], meta, self.caches)
        return self.model.compute_logits(hidden)

    def _capture(self, bs: int):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager = self._forward(bs)  # warm-up (and the reference of the check below)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(bs)
        self.pool = graph.pool()
        graph.replay()
        if not torch.allclose(out, eager, rtol=1e-3, atol=1e-3):
            warnings.warn(f"CUDA graph of decode batch {bs} disagrees with eager execution; running it eagerly")
            return None
        return graph, out

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata) -> Optional[torch.Tensor]:
        """fp32 logits [num_decode, vocab] of a decode-only batch, or None (run it eagerly)."""
        nd = meta.num_decode
        bs = next(b for b in self.sizes if b >= nd)
        w = meta.decode_block_table.shape[1]
        self.ids[:nd].copy_(input_ids)
        self.pos[:nd].copy_(positions)
        self.slots[:nd].copy_(meta.slot_mapping)
        self.seqlens[:nd].copy_(meta.decode_seqlens)
        self.table[:nd, :w].copy_(meta.decode_block_table)
        self.ids[nd:bs].zero_()
        self.pos[nd:bs].zero_()
        self.slots[nd:bs].fill_(-1)
        self.seqlens[nd:bs].fill_(1)
        self.table[nd:bs].zero_()
        if bs not in self.graphs:
            self.graphs[bs] = self._capture(bs)
        entry = self.graphs[bs]
        if entry is None:
            return None
        entry[0].replay()
        return entry[1][:nd]
