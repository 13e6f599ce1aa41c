"""Block bookkeeping (no tensors here): the device BlockPool with refcounts, prefix-cache index and
LRU eviction, and the HostPool used by the CPU offload tier and by swap preemption.

Prefix-cache identity. A full block is looked up by the chained hash of its tokens and of all
blocks before it. Hashes can collide, so a hit also requires (1) the block's own token ids to be
equal and (2) the block's recorded parent to be the very entry matched for the previous block:
every registration gets a unique id (`reg`), and a block stores its parent's `reg`. By induction
a hit therefore holds exactly the KV of the same token prefix."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT_REG = 0  # parent of the first block of every sequence


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The chained hash of one full block: its tokens and the hash of the block before it (0 for
    the first). Python's hash of int tuples does not depend on PYTHONHASHSEED, so the value is the
    same in every process."""
    return hash((parent, tuple(tokens)))


def chain_block_hashes(token_ids: Sequence[int], block_size: int, start: Sequence[int] = ()) -> List[int]:
    """Hashes of every full block of token_ids, continuing the already hashed leading blocks `start`."""
    out = list(start)
    for i in range(len(out), len(token_ids) // block_size):
        out.append(block_hash(out[i - 1] if i else 0, token_ids[i * block_size:(i + 1) * block_size]))
    return out


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "tokens", "reg", "parent_reg")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Optional[int] = None  # set while registered in the prefix cache
        self.tokens: Optional[tuple] = None
        self.reg = 0
        self.parent_reg = 0


class Evicted:
    """A cached block leaving the device pool (candidate for the offload tier)."""
    __slots__ = ("block_id", "block_hash", "tokens", "reg", "parent_reg")

    def __init__(self, b: Block):
        self.block_id, self.block_hash, self.tokens = b.block_id, b.block_hash, b.tokens
        self.reg, self.parent_reg = b.reg, b.parent_reg


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_cnt 0, least recently used first. Uncached ones are put in front (they
        # are worth nothing), cached ones at the back (evicted only when nothing else is free).
        self.free: "OrderedDict[int, None]" = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: Dict[int, Block] = {}   # block hash -> registered block
        self._next_reg = ROOT_REG
        # Called (kind, block hash, parent hash, tokens) with kind "stored" when a block enters the
        # prefix index, "removed" when it leaves it (parent and tokens None) and "cleared" when a
        # reset empties it (hash 0): the one place where a replica's KV state is published.
        self.on_event: Optional[Callable[[str, int, Optional[int], Optional[tuple]], None]] = None
        # reg -> hash of the indexed blocks: a stored event names its parent by hash (published
        # KV events chain by hash), the pool links by reg.
        self._reg_hash: Dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def new_reg(self) -> int:
        self._next_reg += 1
        return self._next_reg

    def allocate(self, n: int) -> Tuple[List[int], List[Evicted]]:
        """n blocks with ref_cnt 1, LRU first; cached blocks taken are evicted from the index and
        returned so their contents can be offloaded before being overwritten."""
        if n > len(self.free):
            raise RuntimeError(f"BlockPool: {n} blocks requested, {len(self.free)} free")
        out, evicted = [], []
        for _ in range(n):
            bid, _ = self.free.popitem(last=False)
            b = self.blocks[bid]
            if b.block_hash is not None:
                evicted.append(Evicted(b))
                self._uncache(b)
            b.ref_cnt = 1
            out.append(bid)
        return out, evicted

    def touch(self, bid: int) -> None:
        """One more user of a (possibly free, cached) block."""
        b = self.blocks[bid]
        if b.ref_cnt == 0:
            del self.free[bid]
        b.ref_cnt += 1

    def release(self, bids) -> None:
        """Drop one reference to each block, in the given order (callers pass a sequence's blocks
        tail first so that its prefix stays cached longest)."""
        for bid in bids:
            b = self.blocks[bid]
            if b.ref_cnt <= 0:
                raise RuntimeError(f"BlockPool: block {bid} released more often than taken")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free[bid] = None
                if b.block_hash is None:
                    self.free.move_to_end(bid, last=False)

    def lookup(self, block_hash: int, tokens: tuple, parent_reg: int) -> Optional[Block]:
        b = self.cached.get(block_hash)
        if b is not None and b.parent_reg == parent_reg and b.tokens == tokens:
            return b
        return None

    def register(self, bid: int, block_hash: int, tokens: tuple, parent_reg: int, reg: int = 0) -> int:
        """Index a computed full block; returns its reg id. If the hash is taken, the block stays
        unindexed (a duplicate or a colliding block) and the id of an equal indexed block, or a
        fresh unfindable one, is returned so children chain correctly."""
        hit = self.lookup(block_hash, tokens, parent_reg)
        if hit is not None:
            return hit.reg
        if block_hash in self.cached:
            return self.new_reg()
        b = self.blocks[bid]
        b.block_hash, b.tokens, b.parent_reg = block_hash, tokens, parent_reg
        b.reg = reg or self.new_reg()
        self.cached[block_hash] = b
        self._reg_hash[b.reg] = block_hash
        if self.on_event is not None:
            # None for a first block, or a parent that left the index meanwhile
            self.on_event("stored", block_hash, self.parent_hash(b), tokens)
        return b.reg

    def parent_hash(self, b: Block) -> Optional[int]:
        """The hash of an indexed block's parent, or None (a first block, or a parent that left
        the index)."""
        return self._reg_hash.get(b.parent_reg)

    def _uncache(self, b: Block, quiet: bool = False) -> None:
        del self.cached[b.block_hash]
        self._reg_hash.pop(b.reg, None)
        if self.on_event is not None and not quiet:
            self.on_event("removed", b.block_hash, None, None)
        b.block_hash, b.tokens, b.reg, b.parent_reg = None, None, 0, 0

    def evict_all_cached(self) -> None:
        """Drop the prefix index of every free block (e.g. when prefix caching is reset). When that
        empties the index, one "cleared" event says so instead of a "removed" per block."""
        drop = [self.blocks[bid] for bid in self.free if self.blocks[bid].block_hash is not None]
        everything = len(drop) == len(self.cached)
        for b in drop:
            self._uncache(b, quiet=everything)
        if everything and drop and self.on_event is not None:
            self.on_event("cleared", 0, None, None)


class HostEntry:
    __slots__ = ("block_id", "tokens", "reg", "parent_reg")

    def __init__(self, block_id, tokens, reg, parent_reg):
        self.block_id, self.tokens, self.reg, self.parent_reg = block_id, tokens, reg, parent_reg


class HostPool:
    """Host-memory blocks: free ones, plus (offload tier) an LRU index of cached prefix blocks
    that are evicted when space is needed."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free: List[int] = list(range(num_blocks - 1, -1, -1))
        self.cached: "OrderedDict[int, HostEntry]" = OrderedDict()

    @property
    def num_available(self) -> int:
        return len(self.free) + len(self.cached)

    def take(self, n: int) -> Optional[List[int]]:
        """n blocks (free first, then evicting LRU cached entries), or None if impossible."""
        if n > self.num_available:
            return None
        out = []
        for _ in range(n):
            if self.free:
                out.append(self.free.pop())
            else:
                _, e = self.cached.popitem(last=False)
                out.append(e.block_id)
        return out

    def give_back(self, bids: List[int]) -> None:
        self.free.extend(bids)

    def lookup(self, block_hash: int, tokens: tuple, parent_reg: int) -> Optional[HostEntry]:
        e = self.cached.get(block_hash)
        if e is not None and e.parent_reg == parent_reg and e.tokens == tokens:
            self.cached.move_to_end(block_hash)
            return e
        return None
