"""Block pool and KV-cache manager: refcounts, prefix hits (with the collision guard), LRU
eviction, the offload tier and swap, with no leaks."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")

from llmkern.engine.block_pool import BlockPool, HostPool
from llmkern.engine.config import EngineConfig
from llmkern.engine.kv_cache_manager import KVCacheManager, build_kv_cache
from llmkern.kvcache import alloc_caches
from llmkern.engine.sampling_params import SamplingParams
from llmkern.engine.sequence import Request, Sequence

BS = 4


def make_seq(tokens, sid=[0]):
    sid[0] += 1
    return Sequence(sid[0], Request(str(sid[0]), None, list(tokens), SamplingParams()), 0, None)


def make_kv(n=16, offload=0, swap=0, caching=True):
    geom = (BS, 2, 1, 4, torch.float32)
    return KVCacheManager(alloc_caches(n, *geom, device="cpu"), BS, caching,
                          alloc_caches(offload, *geom, device="cpu") if offload else None,
                          alloc_caches(swap, *geom, device="cpu") if swap else None)


def fill(kv, seq):
    """Pretend the model computed seq's tokens: write token-dependent KV, advance, index blocks."""
    assert kv.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    for pos in range(seq.num_computed_tokens, seq.num_tokens):
        b, off = seq.block_ids[pos // BS], pos % BS
        for k, v in kv.caches:
            k[b, off] = float(seq.token_ids[pos])
            v[b, off] = -float(seq.token_ids[pos])
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_blocks(seq)


def kv_tokens(kv, seq, n):
    return [int(kv.caches[0][0][seq.block_ids[p // BS], p % BS, 0, 0]) for p in range(n)]


def test_block_pool_refcounts_and_lru():
    pool = BlockPool(4)
    a, ev = pool.allocate(3)
    assert ev == [] and pool.num_free == 1
    pool.register(a[0], 111, (1, 2), 0)
    pool.touch(a[0])
    pool.release(reversed(a))
    assert pool.blocks[a[0]].ref_cnt == 1 and pool.num_free == 3
    pool.release([a[0]])
    assert pool.num_free == 4 and all(b.ref_cnt == 0 for b in pool.blocks)
    # Uncached free blocks are reused before the cached one.
    got, ev = pool.allocate(3)
    assert a[0] not in got and ev == []
    got2, ev = pool.allocate(1)
    assert got2 == [a[0]] and len(ev) == 1 and ev[0].block_hash == 111 and 111 not in pool.cached
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    with pytest.raises(RuntimeError):
        pool.release([a[0], a[0]])


def test_collision_guard():
    pool = BlockPool(4)
    (b,), _ = pool.allocate(1)
    r = pool.register(b, 7, (1, 2, 3, 4), 0)
    assert pool.lookup(7, (1, 2, 3, 4), 0).block_id == b
    assert pool.lookup(7, (9, 9, 9, 9), 0) is None        # same hash, other tokens
    assert pool.lookup(7, (1, 2, 3, 4), r + 100) is None  # same tokens, other prefix
    (c,), _ = pool.allocate(1)
    assert pool.register(c, 7, (5, 5, 5, 5), 0) != r and pool.cached[7].block_id == b


def test_prefix_hits_share_blocks_and_counts():
    kv = make_kv()
    s1 = make_seq(range(10, 21))             # 11 tokens: 2 full blocks + 3
    assert kv.acquire_prefix(s1) == 0
    fill(kv, s1)
    s2 = make_seq(list(range(10, 18)) + [99, 98, 97])
    assert kv.acquire_prefix(s2) == 8        # both full blocks shared
    assert s2.block_ids == s1.block_ids[:2]
    assert [kv.pool.blocks[b].ref_cnt for b in s1.block_ids[:2]] == [2, 2]
    fill(kv, s2)
    assert kv_tokens(kv, s2, 11) == s2.token_ids
    s3 = make_seq(list(range(10, 14)) + [0, 0, 0, 0, 5])
    assert kv.acquire_prefix(s3) == 4        # first block only
    s4 = make_seq(range(10, 18))             # whole prompt cached: last block recomputed
    assert kv.acquire_prefix(s4) == 4
    assert kv.stats.prefix_hit_tokens == 16 and kv.stats.prefix_query_tokens == 11 + 11 + 9 + 8
    for s in (s1, s2, s3, s4):
        kv.free(s)
    assert kv.pool.num_free == 16 and all(b.ref_cnt == 0 for b in kv.pool.blocks)


def test_lru_eviction_then_offload_hit_restores_contents():
    kv = make_kv(n=6, offload=8)
    a = make_seq(range(100, 109))            # 2 full blocks + 1
    kv.acquire_prefix(a)
    fill(kv, a)
    kv.free(a)
    b = make_seq(range(200, 222))            # needs all 6 blocks: evicts a's cached blocks
    kv.acquire_prefix(b)
    fill(kv, b)
    assert kv.stats.blocks_offloaded == 2 and not any(
        kv.pool.lookup(h, (), 0) for h in a.block_hashes)
    kv.free(b)
    a2 = make_seq(list(range(100, 108)) + [1, 2])
    assert kv.acquire_prefix(a2) == 8        # from the host tier
    assert kv.stats.blocks_restored == 2
    assert kv_tokens(kv, a2, 8) == list(range(100, 108))
    fill(kv, a2)
    kv.free(a2)
    assert kv.pool.num_free == 6


def test_swap_out_in_roundtrip():
    kv = make_kv(n=8, swap=8)
    s = make_seq(range(50, 60))
    kv.acquire_prefix(s)
    fill(kv, s)
    assert kv.can_swap_out(s)
    kv.swap_out(s)
    assert s.block_ids == [] and len(s.swap_blocks) == 3 and kv.pool.num_used == 0
    other = make_seq(range(300, 332))        # overwrite every device block
    kv.acquire_prefix(other)
    fill(kv, other)
    kv.free(other)
    kv.swap_in(s)
    assert kv_tokens(kv, s, 10) == list(range(50, 60))
    kv.free(s)
    assert kv.pool.num_free == 8 and kv.swap_pool.num_available == 8


def test_can_swap_in_counts_the_blocks_of_the_next_tokens():
    kv = make_kv(n=4, swap=8, caching=False)
    s = make_seq(range(50, 58))               # 2 full blocks
    kv.acquire_prefix(s)
    fill(kv, s)
    kv.swap_out(s)
    assert kv.num_blocks_to_swap_in(s, 1) == 3 and kv.num_blocks_to_swap_in(s, 0) == 2
    hog = make_seq(range(9))
    assert kv.allocate_slots(hog, 4)          # 1 block taken: 3 free
    assert kv.can_swap_in(s, 1) and not kv.can_swap_in(s, 5)  # 8 + 5 tokens need 4 blocks
    kv.free(hog)
    kv.free(s)


def test_truncate_rolls_back_blocks_but_not_into_the_prefix_cache():
    kv = make_kv(n=8)
    s = make_seq(range(20, 26))               # 6 tokens: 1 full block + 2
    kv.acquire_prefix(s)
    fill(kv, s)
    assert kv.can_allocate(s, 8) and not kv.can_allocate(s, 31)
    assert kv.allocate_slots(s, 8)            # room for 14 tokens: 4 blocks
    assert len(s.block_ids) == 4 and kv.pool.num_free == 4
    kv.truncate(s, 7)                         # keep ceil(7 / 4) = 2 blocks
    assert len(s.block_ids) == 2 and kv.pool.num_free == 6 and s.num_computed_tokens == 6
    kv.truncate(s, 5)
    assert len(s.block_ids) == 2 and s.num_computed_tokens == 5
    with pytest.raises(ValueError, match="num_tokens"):
        kv.truncate(s, 3)                     # block 0 is in the prefix cache
    assert len(s.block_ids) == 2
    kv.free(s)
    assert kv.pool.num_used == 0


def test_build_kv_cache_sizes_every_tier_from_the_budget():
    layers = [(2, 1, 4), (1, 2, 8)]           # a target and a draft model sharing block ids
    block_bytes = (2 * 2 * 1 * 4 + 2 * 1 * 2 * 8) * 4 * BS  # fp32, K and V
    cfg = EngineConfig(block_size=BS, kv_cache_memory_gb=100 * block_bytes / 2**30,
                       cpu_offload_gb=7 * block_bytes / 2**30, preemption_mode="swap",
                       swap_space_gb=5 * block_bytes / 2**30)
    kv = build_kv_cache(cfg, layers, torch.float32, torch.device("cpu"))
    assert kv.num_blocks == 100 and kv.offload.num_blocks == 7 and kv.swap_pool.num_blocks == 5
    assert [tuple(k.shape) for k, _ in kv.caches] == [(100, BS, 1, 4)] * 2 + [(100, BS, 2, 8)]
    assert all(k.shape[0] == 7 for k, _ in kv.offload_caches) and all(v.shape[0] == 5 for _, v in kv.swap_caches)
    kv = build_kv_cache(EngineConfig(block_size=BS, num_gpu_blocks=3), layers, torch.float32, torch.device("cpu"))
    assert kv.num_blocks == 3 and kv.offload is None and kv.swap_pool is None
    with pytest.raises(ValueError, match="kv_cache_memory_gb"):
        build_kv_cache(EngineConfig(block_size=BS, kv_cache_memory_gb=block_bytes / 2 / 2**30), layers,
                       torch.float32, torch.device("cpu"))


def test_host_pool_take_evicts_lru():
    hp = HostPool(2)
    x = hp.take(2)
    assert sorted(x) == [0, 1] and hp.take(1) is None
    hp.give_back(x)
    assert hp.num_available == 2
