"""The disk KV tier (kvcache.disk_tier) under the block bookkeeping: which model's blocks a
directory holds (the fingerprint), the prefix digest of every registered block (what a file is
checked against), evicted blocks staged for the writer thread, and a sequence's next blocks read
back."""
from __future__ import annotations

import hashlib
from typing import Callable, Dict, List, Tuple

import torch

from ..kvcache.blocks import gather_blocks, scatter_blocks
from ..kvcache.disk_format import ROOT_DIGEST, VERSION, chain_digest
from ..kvcache.disk_tier import BlockKey, DiskTier
from .block_pool import ROOT_REG, Evicted
from .kv_disk_ahead import ReadAhead

_GiB = 1 << 30
_STAGE_BLOCKS = 16  # blocks per staging buffer (more evicted at once take several)
_KEEP_BUFFERS = 8   # staging buffers kept for reuse: a fresh one costs page faults on the engine thread


def model_fingerprint(model, layers, dtype: torch.dtype, block_size: int, extra: str = "") -> str:
    """Hex digest naming what a block's bytes depend on: the model's architecture and a sample of
    its weights (a fine-tune with the same config differs), the KV dtype, geometry and block size."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((VERSION, getattr(model, "config", None), str(dtype), list(layers), block_size, extra)).encode())
    params = list(model.named_parameters()) if hasattr(model, "named_parameters") else []
    for name, p in params[:2] + params[-2:]:
        h.update(name.encode())
        try:
            h.update(p.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
        except (RuntimeError, TypeError):  # a weight without data (meta device): its name only
            pass
    return h.hexdigest()


def part_sizes(caches) -> List[int]:
    """Bytes of one block in each K and V cache, layer-major (gather_blocks' order)."""
    return [c[0].numel() * c.element_size() for k, v in caches for c in (k, v)]


class DiskLink:
    def __init__(self, tier: DiskTier, caches, block_size: int, live_regs: Callable[[], set]):
        self.tier = tier
        self.caches = caches
        self.block_size = block_size
        self.digests: Dict[int, bytes] = {}  # reg of a registered block -> its prefix digest
        self._live_regs = live_regs
        self._prune_at = 1024
        self._buffers: List[torch.Tensor] = []  # free staging buffers (the writer gives them back)
        # CPU caches as flat byte views: blocks are copied with memoryview slices, one thread, no
        # temporaries (torch's copies split over its threads stall when the other cores are busy)
        self._rows = None if caches[0][0].is_cuda else [
            memoryview(c.view(c.shape[0], -1).view(torch.uint8).numpy().reshape(-1)) for k, v in caches for c in (k, v)]
        self.ahead = ReadAhead(self._walk, lambda key: tier.read(*key), tier.block_bytes)

    def registered(self, reg: int, parent_reg: int, tokens: tuple) -> None:
        parent = ROOT_DIGEST if parent_reg == ROOT_REG else self.digests.get(parent_reg)
        if parent is None:  # the parent's digest is gone: this block is never written
            return
        self.digests[reg] = chain_digest(parent, tokens)
        if len(self.digests) > self._prune_at:  # keep the digests of indexed blocks only
            live = self._live_regs()
            self.digests = {r: d for r, d in self.digests.items() if r in live}
            self._prune_at = max(1024, 2 * len(self.digests))

    def write(self, evicted: List[Evicted], wait: bool = False) -> None:
        """Stage evicted blocks for the writer (before the device blocks are reused)."""
        if not self.tier.writable:
            return
        todo = [(e.block_id, (e.block_hash, self.digests[e.reg], e.tokens)) for e in evicted
                if e.reg in self.digests and not self.tier.known(e.block_hash)]
        for i in range(0, len(todo), _STAGE_BLOCKS):
            part = todo[i:i + _STAGE_BLOCKS]
            keys = [k for _, k in part]
            if not wait and self.tier.full():  # dropped before anything is copied
                self.tier.submit(keys, None)
                continue
            buf = self._buffers.pop() if self._buffers else self._new_buffer()
            data, ready = self._stage([bid for bid, _ in part], buf)
            if not self.tier.submit(keys, data, ready, wait, done=lambda b=buf: self._give_back(b)):
                self._give_back(buf)

    def _new_buffer(self) -> torch.Tensor:
        pin = self.caches[0][0].is_cuda  # the device -> host copy is then asynchronous
        with torch.inference_mode(False):  # a plain tensor: also written outside the engine's steps (shutdown)
            return torch.empty(_STAGE_BLOCKS * self.tier.block_bytes, dtype=torch.uint8, pin_memory=pin)

    def _give_back(self, buf: torch.Tensor) -> None:
        if len(self._buffers) < _KEEP_BUFFERS:
            self._buffers.append(buf)

    def _stage(self, block_ids: List[int], buf: torch.Tensor):
        """The blocks' bytes in (a prefix of) buf, and a CUDA event that completes once they are there."""
        n = len(block_ids)
        out = buf[:n * self.tier.block_bytes]
        if self._rows is not None:
            mv, off = memoryview(out.numpy()), 0
            for rows, s in zip(self._rows, self.tier.parts):
                for j, b in enumerate(block_ids):
                    mv[off + j * s:off + (j + 1) * s] = rows[b * s:(b + 1) * s]
                off += n * s
            return out, None
        # The copy is queued on the stream ahead of whatever overwrites the blocks; the writer
        # thread waits on the event, the engine thread does not.
        out.copy_(gather_blocks(self.caches, block_ids), non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return out, ready

    def load(self, block_ids: List[int], payloads: List[memoryview]) -> None:
        """Write blocks read from disk into the device blocks block_ids."""
        if self._rows is None:
            scatter_blocks(self.caches, block_ids, self.tier.assemble(payloads))
            return
        src = 0
        for rows, s in zip(self._rows, self.tier.parts):
            for b, p in zip(block_ids, payloads):
                rows[b * s:(b + 1) * s] = p[src:src + s]
            src += s

    def find(self, token_ids, hashes: List[int], start: int, stop: int) -> List[Tuple[BlockKey, memoryview]]:
        """Blocks start.. of a prompt found on disk (read ahead, else read now) and verified, in
        order, stopping at the first miss or at `stop`."""
        return self._walk(token_ids, hashes, start, stop, self._take)

    def _take(self, key: BlockKey):
        payload = self.ahead.take(key)
        return payload if payload is not None else self.tier.read(*key)

    def _walk(self, token_ids, hashes: List[int], start: int, stop: int, read) -> List[Tuple[BlockKey, memoryview]]:
        bs = self.block_size
        d = ROOT_DIGEST
        for i in range(start):
            d = chain_digest(d, token_ids[i * bs:(i + 1) * bs])
        out = []
        for i in range(start, stop):
            toks = tuple(token_ids[i * bs:(i + 1) * bs])
            d = chain_digest(d, toks)
            payload = read((hashes[i], d, toks))
            if payload is None:
                break
            out.append(((hashes[i], d, toks), payload))
        return out

    def close(self, cached: List[Evicted]) -> None:
        """Write what the device still caches (a restarted engine finds it), then stop the threads."""
        self.ahead.close()
        self.write(cached[-max(1, self.tier.max_bytes // max(1, self.tier.block_bytes)):], wait=True)
        self.tier.flush()
        self.tier.close()

    def stats_fields(self, hit_tokens: int) -> dict:
        s = self.tier.stats
        return dict(kv_disk_hit_tokens=hit_tokens, kv_disk_blocks_written=s.blocks_written,
                    kv_disk_write_drops=s.write_drops, kv_disk_bad_files=s.bad_files)


def open_disk_tier(config, layers, dtype: torch.dtype, model, caches, live_regs, kv_quant: str = "") -> DiskLink:
    # kv_quant: a quantised cache's kind and scales, which its blocks' bytes depend on
    fp = model_fingerprint(model, layers, dtype, config.block_size, repr(config.speculative) + kv_quant)
    tier = DiskTier(config.kv_disk_path, int(config.kv_disk_gb * _GiB), fp, part_sizes(caches))
    return DiskLink(tier, caches, config.block_size, live_regs)
