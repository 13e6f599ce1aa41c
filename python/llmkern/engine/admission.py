"""Throughput-first admission for offline work (EngineConfig.schedule="throughput").

Arrival order is fair but wasteful on offline batches: requests that share a prompt prefix (one
document, many questions) are admitted side by side, each computes the prefix before any of them
has cached it, and the longest requests may start last and finish alone. Here the waiting queue is
instead
  - grouped by prefix: sorted by the chained block hashes of the prompt (the prefix cache's own
    hash, so equal prefixes sort together, trie order), groups with the most work first (a long
    tail of one long request running alone is what empties the batch at the end);
  - deduplicated while in flight: a request whose prompt shares a not yet computed block with a
    prompt being prefilled right now waits until that block is cached, and the token budget goes
    to the next request instead."""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, List, Set

from .block_pool import chain_block_hashes
from .sequence import Sequence


def prompt_hashes(seq: Sequence, block_size: int) -> List[int]:
    """The chained hashes of the prompt's full blocks that can be shared (the last prompt token is
    always computed, so a block ending on it is not counted); cached on the sequence."""
    upto = (seq.num_prompt_tokens - 1) // block_size
    if len(seq.block_hashes) < upto:
        seq.block_hashes[:] = chain_block_hashes(seq.token_ids[:upto * block_size], block_size, seq.block_hashes)
    return seq.block_hashes[:upto]


def _work(seq: Sequence, max_model_len: int) -> int:
    p = seq.params
    out = p.max_tokens if p.max_tokens is not None else max_model_len - seq.num_prompt_tokens
    return seq.num_prompt_tokens + out


def throughput_order(seqs: Iterable[Sequence], block_size: int, max_model_len: int) -> List[Sequence]:
    """Preempted sequences first (as they were), then prefix groups by total work, largest first;
    inside a group, trie order of the block hashes, then longer requests first."""
    seqs = list(seqs)
    hashes = {s.seq_id: tuple(prompt_hashes(s, block_size)) for s in seqs}

    def group(s):
        h = hashes[s.seq_id]
        return (0, h[0]) if h else (1, s.seq_id)

    group_work = defaultdict(int)
    for s in seqs:
        group_work[group(s)] += _work(s, max_model_len)
    return sorted(seqs, key=lambda s: (s.num_preemptions == 0, -group_work[group(s)], group(s),
                                       hashes[s.seq_id], -_work(s, max_model_len)))


def inflight_hashes(running: Iterable[Sequence], block_size: int) -> Set[int]:
    """Hashes of prompt blocks that running sequences are computing but have not cached yet."""
    out: Set[int] = set()
    for s in running:
        if s.num_computed_tokens < s.num_prompt_tokens:
            out.update(prompt_hashes(s, block_size)[s.num_cached_blocks:])
    return out


def waits_for_inflight(seq: Sequence, inflight: Set[int], block_size: int) -> bool:
    return bool(inflight) and any(h in inflight for h in prompt_hashes(seq, block_size))
