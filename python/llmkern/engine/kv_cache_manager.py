"""KVCacheManager: the block bookkeeping on top of the KV tiers (kvcache.KVTiers): per-sequence
block tables (allocation, rollback), prefix caching (chained block hashes), the CPU offload tier
for evicted prefix blocks, and swap-out/in of preempted sequences. A model-parallel engine logs the
tier copies it makes so the other ranks replay them on their shards."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ..kvcache import Caches, KVTiers, LayerGroup, build_kv_tiers
from ..layers.kv_quant import KvCacheQuant, attach
from .kv_quant import quant_fingerprint
from .config import EngineConfig
from .block_pool import ROOT_REG, BlockPool, Evicted, HostEntry, HostPool, block_hash
from .sequence import Sequence


def build_kv_cache(config: EngineConfig, layers: List[LayerGroup], dtype: torch.dtype,
                   device: torch.device, model=None,
                   quants: Optional[List[KvCacheQuant]] = None) -> "KVCacheManager":
    """The engine's KV cache: the tiers sized from config (kvcache.build_kv_tiers) under the block
    bookkeeping, and the disk tier when config has a kv_disk_path (its files are `model`'s).
    quants: per target-model layer, the scales of a quantised cache (kv_quant.kv_cache_quants)."""
    kv = KVCacheManager.on_tiers(build_kv_tiers(config.kv_spec(), layers, dtype, device), config.block_size,
                                 config.enable_prefix_caching)
    for (k_cache, v_cache), q in zip(kv.caches, quants or []):
        attach(k_cache, v_cache, q)
    if config.kv_prefault:
        kv.tiers.prefault()
    if config.kv_disk_path is not None:
        from .kv_disk import open_disk_tier

        kv.disk = open_disk_tier(config, layers, dtype, model, kv.caches, kv.live_regs, quant_fingerprint(quants))
    return kv


@dataclass
class CacheStats:
    prefix_query_tokens: int = 0     # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0       # ... found (device, host or disk tier)
    offload_hit_tokens: int = 0      # ... found in the host tier and brought back
    disk_hit_tokens: int = 0         # ... found in the disk tier and read back
    blocks_offloaded: int = 0        # device -> host copies of evicted prefix blocks
    blocks_restored: int = 0         # host -> device copies on offload hits
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0

    @property
    def hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0


class KVCacheManager:
    def __init__(self, caches: Caches, block_size: int, enable_prefix_caching: bool,
                 offload_caches: Optional[Caches] = None, swap_caches: Optional[Caches] = None):
        self.tiers = KVTiers(caches, offload_caches if enable_prefix_caching else None, swap_caches)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(caches[0][0].shape[0] if caches else 0)
        self.offload = HostPool(self.offload_caches[0][0].shape[0]) if self.offload_caches else None
        self.swap_pool = HostPool(swap_caches[0][0].shape[0]) if swap_caches else None
        self.stats = CacheStats()
        self.copy_log: Optional[list] = None  # set by a model-parallel engine: block copies to replay
        self.disk = None  # the disk tier (kv_disk.DiskLink), set by build_kv_cache

    @classmethod
    def on_tiers(cls, tiers: KVTiers, block_size: int, enable_prefix_caching: bool) -> "KVCacheManager":
        return cls(tiers.caches, block_size, enable_prefix_caching, tiers.offload_caches, tiers.swap_caches)

    # the tensors of each tier (the model runner reads `caches`)
    caches = property(lambda self: self.tiers.caches)
    offload_caches = property(lambda self: self.tiers.offload_caches)
    swap_caches = property(lambda self: self.tiers.swap_caches)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    # -- copies ---------------------------------------------------------------------------------
    def _copy(self, src: str, dst: str, pairs: List[Tuple[int, int]]) -> None:
        if pairs and self.copy_log is not None:  # model-parallel ranks replay them on their shards
            self.copy_log.append((src, dst, list(pairs)))
        self.tiers.copy_blocks_between(src, dst, pairs)

    def _allocate(self, n: int) -> List[int]:
        bids, evicted = self.pool.allocate(n)
        if evicted and self.disk is not None:
            self.disk.write(evicted)
        if evicted and self.offload is not None:
            self._offload(evicted)
        return bids

    def _offload(self, evicted: List[Evicted]) -> None:
        """Keep evicted prefix blocks in the host tier (before the device blocks are reused)."""
        todo = [e for e in evicted if e.block_hash not in self.offload.cached]
        todo = todo[-self.offload.num_blocks:] if self.offload.num_blocks else []
        host = self.offload.take(len(todo)) if todo else None
        if not host:
            return
        for e, h in zip(todo, host):
            self.offload.cached[e.block_hash] = HostEntry(h, e.tokens, e.reg, e.parent_reg)
        self._copy("device", "offload", [(e.block_id, h) for e, h in zip(todo, host)])
        self.stats.blocks_offloaded += len(todo)

    # -- per-sequence API -----------------------------------------------------------------------
    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_ids))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether allocate_slots(seq, num_new_tokens) would succeed now."""
        return self.num_blocks_needed(seq, num_new_tokens) <= self.pool.num_free

    def _hash_blocks(self, seq: Sequence, upto: int) -> None:
        bs = self.block_size
        hashes = seq.block_hashes
        toks = seq.token_ids
        for i in range(len(hashes), upto):
            hashes.append(block_hash(hashes[i - 1] if i else 0, toks[i * bs:(i + 1) * bs]))

    def cached_prefix_tokens(self, seq: Sequence) -> int:
        """Prompt tokens a waiting sequence would find cached (device, host or disk tier) if it
        started now, by block hash alone (an estimate for load reports: a colliding hash is caught
        when acquire_prefix compares the tokens, a bad file when it reads it); takes nothing. Runs
        after every step for every waiting sequence: set and dictionary lookups only, each block's
        hash computed once per sequence."""
        if not self.enable_prefix_caching or seq.block_ids:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        n = self._resident_blocks(seq, max_blocks)
        disk = self.disk.tier.index if self.disk is not None else ()
        while n < max_blocks and seq.block_hashes[n] in disk:
            n += 1
        return n * self.block_size

    def _resident_blocks(self, seq: Sequence, max_blocks: int) -> int:
        """Leading blocks of seq in the device or host tier, by hash."""
        self._hash_blocks(seq, max_blocks)
        dev = self.pool.cached
        host = self.offload.cached if self.offload is not None else {}
        n = 0
        while n < max_blocks and (seq.block_hashes[n] in dev or seq.block_hashes[n] in host):
            n += 1
        return n

    def prefetch(self, seq: Sequence) -> None:
        """For a sequence just queued: start reading the blocks it will look up on disk."""
        if self.disk is not None and not seq.block_ids:
            max_blocks = (seq.num_tokens - 1) // self.block_size
            self.disk.ahead.submit(seq.token_ids, seq.block_hashes, self._resident_blocks(seq, max_blocks), max_blocks)

    def acquire_prefix(self, seq: Sequence) -> int:
        """For a sequence about to start: take the longest cached prefix of full blocks (at least
        one token is always left to compute); returns the number of tokens it covers."""
        assert not seq.block_ids and seq.num_computed_tokens == 0
        seq.prompt_cache_hit_tokens = 0
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        self._hash_blocks(seq, max_blocks)
        plan = []  # per hit block, in order: (device block id, None) or (None, host entry)
        parent = ROOT_REG
        for i in range(max_blocks):
            h = seq.block_hashes[i]
            toks = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            b = self.pool.lookup(h, toks, parent)
            if b is not None:
                self.pool.touch(b.block_id)  # off the free list: later allocations cannot evict it
                plan.append((b.block_id, None))
                parent = b.reg
                continue
            e = self.offload.lookup(h, toks, parent) if self.offload is not None else None
            if e is None:
                break
            plan.append((None, e))
            parent = e.reg
        # Host-tier hits need device blocks; cut the plan where the pool runs short.
        n_host, cut = 0, len(plan)
        walked = len(plan)  # blocks found before the first miss
        for j, (_, e) in enumerate(plan):
            if e is not None:
                if n_host == self.pool.num_free:
                    cut = j
                    break
                n_host += 1
        self.pool.release([bid for bid, _ in reversed(plan[cut:]) if bid is not None])
        plan = plan[:cut]
        host = [(i, e) for i, (_, e) in enumerate(plan) if e is not None]
        bids = [bid for bid, _ in plan]
        regs = []
        if host:
            for i, e in host:  # pin the entries while device blocks are allocated (that may offload)
                del self.offload.cached[seq.block_hashes[i]]
            dev = self._allocate(len(host))
            self._copy("offload", "device", [(e.block_id, d) for (_, e), d in zip(host, dev)])
            for (i, e), d in zip(host, dev):
                displaced = self.offload.cached.pop(seq.block_hashes[i], None)
                if displaced is not None:  # a colliding entry offloaded meanwhile
                    self.offload.give_back([displaced.block_id])
                self.offload.cached[seq.block_hashes[i]] = e
                self.pool.register(d, seq.block_hashes[i], e.tokens, e.parent_reg, e.reg)
                bids[i] = d
            self.stats.blocks_restored += len(host)
            self.stats.offload_hit_tokens += len(host) * bs
        for bid, e in plan:
            regs.append(e.reg if e is not None else self.pool.blocks[bid].reg)
        if self.disk is not None and cut == walked < max_blocks:  # a miss above, not a short pool: try the disk
            self._from_disk(seq, bids, regs, max_blocks)
        seq.block_ids = bids
        seq.num_cached_blocks = len(bids)
        seq.block_regs = regs
        n = len(bids) * bs
        seq.num_computed_tokens = n
        seq.prompt_cache_hit_tokens = n
        if not seq.num_preemptions:  # re-admissions after preemption would count twice
            self.stats.prefix_query_tokens += seq.num_tokens
            self.stats.prefix_hit_tokens += n
        return n

    def _from_disk(self, seq: Sequence, bids: List[int], regs: List[int], max_blocks: int) -> None:
        """Extend the hit (bids, regs) with the blocks that follow it on disk, read into new
        device blocks (as many as are free) and indexed like computed ones."""
        start = len(bids)
        found = self.disk.find(seq.token_ids, seq.block_hashes, start, min(max_blocks, start + self.pool.num_free))
        if not found:
            return
        dev = self._allocate(len(found))
        self.disk.load(dev, [p for _, p in found])
        parent = regs[-1] if regs else ROOT_REG
        for ((h, digest, toks), _), d in zip(found, dev):
            parent = self.pool.register(d, h, toks, parent)
            self.disk.digests[parent] = digest
            regs.append(parent)
        bids.extend(dev)
        self.stats.disk_hit_tokens += len(found) * self.block_size

    def live_regs(self) -> set:
        """Reg ids of the blocks indexed in the device and host tiers."""
        live = {b.reg for b in self.pool.cached.values()}
        return live | ({e.reg for e in self.offload.cached.values()} if self.offload is not None else set())

    def close(self) -> None:
        """Stop the disk tier's writer once the device's cached blocks are written too."""
        if self.disk is not None:
            self.disk.close([Evicted(b) for b in self.pool.cached.values()])
            self.disk = None

    def stats_fields(self) -> dict:
        """The disk tier's EngineStats fields."""
        return self.disk.stats_fields(self.stats.disk_hit_tokens) if self.disk is not None else {}

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Blocks for the next num_new_tokens of seq; False (nothing changed) if the pool is short."""
        if not self.can_allocate(seq, num_new_tokens):
            return False
        need = self.num_blocks_needed(seq, num_new_tokens)
        if need:
            seq.block_ids.extend(self._allocate(need))
        return True

    def cache_blocks(self, seq: Sequence) -> None:
        """Index the sequence's newly completed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        if full <= seq.num_cached_blocks:
            return
        self._hash_blocks(seq, full)
        regs = seq.block_regs
        for i in range(seq.num_cached_blocks, full):
            parent = regs[i - 1] if i else ROOT_REG
            toks = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            regs.append(self.pool.register(seq.block_ids[i], seq.block_hashes[i], toks, parent))
            if self.disk is not None:
                self.disk.registered(regs[-1], parent, toks)
        seq.num_cached_blocks = full

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll seq back to its first num_tokens tokens: the blocks past them return to the pool
        (e.g. the slots of rejected speculative drafts). Blocks indexed in the prefix cache are
        final and cannot be rolled back into."""
        if num_tokens < seq.num_cached_blocks * self.block_size:
            raise ValueError(f"num_tokens: {num_tokens} would cut into the {seq.num_cached_blocks} blocks "
                             f"already in the prefix cache")
        keep = -(-num_tokens // self.block_size)
        if len(seq.block_ids) > keep:
            self.pool.release(reversed(seq.block_ids[keep:]))
            del seq.block_ids[keep:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)

    def free(self, seq: Sequence) -> None:
        self.pool.release(reversed(seq.block_ids))
        seq.block_ids = []
        seq.num_cached_blocks = 0
        seq.block_regs = []
        if seq.swap_blocks:
            self.swap_pool.give_back(seq.swap_blocks)
            seq.swap_blocks = []

    def pin(self, block_ids: List[int]) -> None:
        """One more reference to each block (a KV hand-over holds them: not freed, not evicted)."""
        for bid in block_ids:
            self.pool.touch(bid)

    def unpin(self, block_ids: List[int]) -> None:
        """Drop pin()'s references (tail first: the prefix stays cached longest)."""
        self.pool.release(reversed(block_ids))

    def reset_prefix_cache(self) -> None:
        """Drop the index of every cached block not in use, on the device and in the host tier
        (not the disk tier's files: other engines share them)."""
        self.pool.evict_all_cached()
        if self.offload is not None:
            self.offload.give_back([e.block_id for e in self.offload.cached.values()])
            self.offload.cached.clear()

    # -- swap preemption ------------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return self.swap_pool is not None and len(seq.block_ids) <= self.swap_pool.num_available

    def swap_out(self, seq: Sequence) -> None:
        host = self.swap_pool.take(len(seq.block_ids))
        self._copy("device", "swap", list(zip(seq.block_ids, host)))
        self.stats.blocks_swapped_out += len(host)
        self.free(seq)
        seq.swap_blocks = host

    def num_blocks_to_swap_in(self, seq: Sequence, num_new_tokens: int) -> int:
        """Device blocks a swapped-out seq needs to come back and then run num_new_tokens."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(len(seq.swap_blocks), total)

    def can_swap_in(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_to_swap_in(seq, num_new_tokens) <= self.pool.num_free

    def swap_in(self, seq: Sequence) -> None:
        dev = self._allocate(len(seq.swap_blocks))
        self._copy("swap", "device", list(zip(seq.swap_blocks, dev)))
        self.stats.blocks_swapped_in += len(dev)
        self.swap_pool.give_back(seq.swap_blocks)
        seq.swap_blocks = []
        seq.block_ids = dev
        # The restored blocks are private copies; index them again (equal indexed blocks win).
        seq.num_cached_blocks = 0
        seq.block_regs = []
        self.cache_blocks(seq)
