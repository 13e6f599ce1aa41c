"""The disk KV tier: full prefix blocks as files under DIR/<model fingerprint>/, one file per block
named by its block hash, shared by every engine (process) of the host pointed at DIR and kept
across restarts.

Writes run on a writer thread behind a bounded queue (a full queue drops the blocks and counts
them), each to a temporary file renamed over the final name, so a reader never sees a partial file
and two writers of the same block both leave a whole one. Reads verify everything
(disk_format.decode) and delete what does not verify. The directory is kept under max_bytes by
deleting the least recently used files (a hit touches its file); a full disk turns writes off."""
from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .disk_format import BadBlock, decode, encode_header, payload_crc

log = logging.getLogger("llmkern.kvcache")
SUFFIX = ".kvb"
_STALE_TMP_S = 600.0   # a temporary file this old was left by a writer that died
_RESCAN_EVERY = 256    # writes between directory scans (other engines write there too)

BlockKey = Tuple[int, bytes, tuple]  # (block hash, prefix digest, token ids)


@dataclass
class DiskStats:
    hit_blocks: int = 0        # blocks read and verified
    blocks_written: int = 0
    write_drops: int = 0       # blocks not written: the queue was full, or writes are off
    write_errors: int = 0
    bad_files: int = 0         # files that failed verification (deleted, never loaded)
    files_evicted: int = 0     # deleted to stay under the size bound


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


class DiskTier:
    """part_sizes: the bytes of one block in each K and V cache, layer-major (the layout of
    kvcache.blocks.gather_blocks, whose n-block buffers submit() takes and assemble() builds)."""

    def __init__(self, root: str, max_bytes: int, fingerprint: str, part_sizes: Sequence[int],
                 queue_jobs: int = 64):
        self.dir = os.path.join(root, fingerprint)
        os.makedirs(self.dir, exist_ok=True)
        self.fingerprint = bytes.fromhex(fingerprint)
        self.max_bytes = max_bytes
        self.parts = list(part_sizes)
        self.block_bytes = sum(self.parts)
        self.stats = DiskStats()
        self.writable = True
        self._q: "queue.Queue" = queue.Queue(maxsize=queue_jobs)
        self._thread: Optional[threading.Thread] = None
        self._writes_since_scan = 0
        self._bytes = 0
        self.index: set = set()  # block hashes believed on disk (a hint: reads verify)
        self._enforce_bound()

    def _path(self, h: int) -> str:
        return os.path.join(self.dir, f"{h & ((1 << 64) - 1):016x}{SUFFIX}")

    # -- reads (the engine thread) --------------------------------------------------------------
    def known(self, h: int) -> bool:
        return h in self.index

    def read(self, h: int, digest: bytes, tokens: tuple) -> Optional[memoryview]:
        """The verified payload of a block, or None (absent, or bad: then deleted)."""
        path = self._path(h)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.index.discard(h)
            return None
        try:
            payload = decode(data, self.fingerprint, h, digest, tokens, self.block_bytes)
        except BadBlock as e:
            log.warning("llmkern: disk KV tier: %s: %s; deleted", os.path.basename(path), e)
            self.stats.bad_files += 1
            self._unlink(path, h)
            return None
        try:
            os.utime(path)  # the LRU order is by modification time
        except OSError:
            pass
        self.index.add(h)
        self.stats.hit_blocks += 1
        return payload

    def assemble(self, payloads: List[memoryview]) -> torch.Tensor:
        """One buffer in gather_blocks' n-block layout from per-block payloads."""
        n = len(payloads)
        out = torch.empty(n * self.block_bytes, dtype=torch.uint8)
        mv = memoryview(out.numpy())
        off = src = 0
        for s in self.parts:
            for j, p in enumerate(payloads):
                mv[off + j * s:off + (j + 1) * s] = p[src:src + s]
            off += n * s
            src += s
        return out

    # -- writes ---------------------------------------------------------------------------------
    def full(self) -> bool:
        return self._q.full()

    def submit(self, keys: List[BlockKey], data: Optional[torch.Tensor], ready=None, wait: bool = False,
               done: Optional[Callable[[], None]] = None) -> bool:
        """Queue blocks for writing: data is their n-block buffer on the CPU (None: drop them);
        ready (a CUDA event or None) completes once data is filled; done() is called once data is
        no longer needed. Without wait, a full queue drops them. False when dropped."""
        if not self.writable or data is None:
            self.stats.write_drops += len(keys)
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llmkern-kv-disk", daemon=True)
            self._thread.start()
        try:
            self._q.put((keys, data, ready, done), block=wait)
            return True
        except queue.Full:
            self.stats.write_drops += len(keys)
            return False

    def flush(self) -> None:
        """Wait until every queued block is written (or dropped)."""
        if self._thread is not None:
            self._q.join()

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._q.get()
            try:
                if job is None:
                    return
                self._write_job(*job[:3])
            except Exception:  # the engine goes on without the blocks
                log.exception("llmkern: disk KV tier: write failed")
            finally:
                if job is not None and job[3] is not None:
                    job[3]()
                self._q.task_done()

    def _write_job(self, keys: List[BlockKey], data: torch.Tensor, ready) -> None:
        if ready is not None:
            ready.synchronize()
        n = len(keys)
        mv = memoryview(data.numpy())
        for j, (h, digest, tokens) in enumerate(keys):
            if not self.writable:
                self.stats.write_drops += n - j
                return
            chunks, off = [], 0
            for s in self.parts:
                chunks.append(mv[off + j * s:off + (j + 1) * s])
                off += n * s
            self._write_block(h, digest, tokens, chunks)
        if self._bytes > self.max_bytes or self._writes_since_scan >= _RESCAN_EVERY:
            self._enforce_bound()

    def _write_block(self, h: int, digest: bytes, tokens: tuple, chunks: list) -> None:
        path = self._path(h)
        if os.path.exists(path):  # another engine (or an earlier run) wrote it
            self.index.add(h)
            return
        header = encode_header(self.fingerprint, h, digest, tokens, self.block_bytes, payload_crc(chunks))
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # one per writer: renames are atomic
        try:
            self._write_file(tmp, [header] + chunks)
            os.replace(tmp, path)
        except OSError as e:
            self._unlink(tmp)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self.writable = False
                log.warning("llmkern: disk KV tier: %s is full; writes are off from now on (%s)", self.dir, e)
                return
            if not self.stats.write_errors:  # once: a removed directory would fail every write
                log.warning("llmkern: disk KV tier: cannot write %s: %s (further errors are only counted)", path, e)
            self.stats.write_errors += 1
            if isinstance(e, FileNotFoundError):  # the directory was removed: the next writes recreate it
                os.makedirs(self.dir, exist_ok=True)
            return
        self.index.add(h)
        self._bytes += len(header) + self.block_bytes
        self._writes_since_scan += 1
        self.stats.blocks_written += 1

    @staticmethod
    def _write_file(path: str, chunks: list) -> None:
        with open(path, "wb") as f:
            for c in chunks:
                f.write(c)

    # -- size bound -----------------------------------------------------------------------------
    def _unlink(self, path: str, h: Optional[int] = None) -> None:
        if h is not None:
            self.index.discard(h)
        try:
            os.unlink(path)
        except OSError:
            pass

    def _enforce_bound(self) -> None:
        """Scan the directory (every engine sharing it writes there), then delete the least
        recently used files down to 90% of max_bytes once it is over."""
        files, now = [], time.time()
        try:
            it = os.scandir(self.dir)
        except OSError:  # removed meanwhile: nothing to count
            return
        with it:
            for e in it:
                try:
                    st = e.stat()
                except OSError:
                    continue  # deleted meanwhile
                if e.name.endswith(SUFFIX):
                    files.append((st.st_mtime, st.st_size, e.path, e.name))
                elif e.name.endswith(".tmp") and now - st.st_mtime > _STALE_TMP_S:
                    self._unlink(e.path)
        total = sum(f[1] for f in files)
        if total > self.max_bytes:
            files.sort()
            k = 0
            while k < len(files) and total > 0.9 * self.max_bytes:
                self._unlink(files[k][2])
                total -= files[k][1]
                k += 1
            self.stats.files_evicted += k
            files = files[k:]
        index = set()
        for _, _, _, name in files:
            try:
                index.add(_signed(int(name[:-len(SUFFIX)], 16)))
            except ValueError:
                pass
        self.index = index
        self._bytes = total
        self._writes_since_scan = 0
