"""KV hand-over between engines on one host through shared memory: the prefill side writes a
pulled request's blocks into a file in /dev/shm (memory, not disk) and answers the pull in the
store with the file's name, size and block hashes; the decode side maps the file, checks it and
copies the blocks into its cache, then removes the file. No thread, no socket of its own: both
sides act inside poll() on the engine thread, signalling through the torch.distributed store.

Both ends are on one host, so besides its incarnation (pull.py) each checks its peer's process id:
a decode engine waiting on a prefill engine that died (or restarted) fails the request at once (not
at its deadline), and a prefill engine removes the files written for a decode engine that died. A
file whose reader never came for another reason is removed once the request's deadline has passed."""
from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Dict, Optional, Tuple

import torch

from .pull import NO_KV, Link, PullConnector, _short
from ..kvcache.blocks import gather_blocks
from .interface import now


_PREFIX = "llmkern-kv-"  # then the writer's pid: files of dead writers can be told apart


def default_shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class ShmConnector(PullConnector):
    kind = "shm"

    def __init__(self, store, rank: int, world_size: int, group: str, timeout_s: float,
                 shm_dir: Optional[str] = None):
        super().__init__(store, rank, world_size, group, timeout_s)
        self.dir = shm_dir or default_shm_dir()
        if not os.path.isdir(self.dir):
            raise ValueError(f"kv_connector: shm_dir {self.dir!r} is not a directory")
        self._waiting: Dict[Tuple[Link, int], str] = {}  # decode: (peer, pull no.) -> request id
        self._files: Dict[str, Tuple[float, Link]] = {}  # prefill: written file -> (remove after, reader)
        self._pids: Dict[Link, int] = {}                 # peer incarnation -> its process id
        self._checked = 0.0
        self._buf: Optional[torch.Tensor] = None         # prefill: staging for gathers

    def bind(self, role: str, caches, block_size: int) -> None:
        super().bind(role, caches, block_size)
        remove_stale_files(self.dir)

    def _gone(self, peer: Link) -> Optional[str]:
        """Why that incarnation of the peer cannot answer any more (its process exited, or its rank
        restarted), or None."""
        pid = self._pids.get(peer)
        key = f"pid/{peer[0]}.{peer[1]}"
        if pid is None and self.store.check([key]):
            pid = self._pids[peer] = int(self.store.get(key))
        try:
            if pid is not None:
                os.kill(pid, 0)
        except ProcessLookupError:
            return f"the engine of rank {peer[0]} (pid {pid}) exited"
        except PermissionError:
            pass
        return super()._gone(peer)

    def _answer(self, peer: Link, seq: int, msg: dict) -> None:
        self.store.set(self._key("done", peer, seq), json.dumps(msg))

    def _send(self, peer, seq, rid, block_ids, hashes) -> None:
        path = os.path.join(self.dir, f"{_PREFIX}{os.getpid()}-{self.group}-{self.rank}-{peer[0]}.{peer[1]}-{seq}")
        nbytes = len(block_ids) * self.block_bytes
        try:
            with open(path, "wb") as f:
                if nbytes:
                    f.write(memoryview(self._gather(block_ids, nbytes).numpy()))
        except (OSError, RuntimeError) as e:
            _unlink(path)
            self._answer(peer, seq, {"ok": False, "error": f"prefill side: shared memory write failed: {e}"})
            return self._send_done(rid, f"shared memory write failed: {e}")
        self._files[path] = (now() + self.timeout_s, peer)
        self._answer(peer, seq, {"ok": True, "path": path, "nbytes": nbytes, "hashes": list(hashes)})
        self._send_done(rid, None)  # the bytes are handed over: the blocks may go

    def _staging(self, nbytes: int) -> torch.Tensor:
        """A reused host buffer for the blocks on their way into a file: gathering into memory
        already touched and write()-ing it costs a fraction of filling a new mapping of the
        file page fault by page fault."""
        if self._buf is None or self._buf.numel() < nbytes:
            pin = self.caches[0][0].is_cuda
            self._buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        return self._buf[:nbytes]

    def _gather(self, block_ids, nbytes: int) -> torch.Tensor:
        buf = self._staging(nbytes)
        if self.caches[0][0].is_cuda:
            return buf.copy_(gather_blocks(self.caches, block_ids))
        return gather_blocks(self.caches, block_ids, out=buf)

    def _send_failure(self, peer, seq, why) -> None:
        self._answer(peer, seq, {"ok": False, "error": why})

    def _begin_recv(self, peer, seq, rid) -> None:
        self._waiting[(peer, seq)] = rid

    def _progress(self) -> None:
        t = now()
        check = time.monotonic() - self._checked > 0.05  # peers' liveness, at most 20 times a second
        if check:
            self._checked = time.monotonic()
        gone = {}
        for path, (until, peer) in list(self._files.items()):
            if not os.path.exists(path):  # read and removed by the decode side
                del self._files[path]
            elif t > until or (check and gone.setdefault(peer, self._gone(peer))):  # its reader is not coming
                _unlink(path)
                del self._files[path]
        for (peer, seq), rid in list(self._waiting.items()):
            key = self._key("done", peer, seq)
            if not self.store.check([key]):
                why = (gone.setdefault(peer, self._gone(peer)) or self.broken.get(peer)) if check else None
                if why:  # the prefill engine died or restarted: this answer will never come
                    self._peer_failed(peer, why)
                    del self._waiting[(peer, seq)]
                    self.store.delete_key(self._key("pull", peer, seq))   # if still unserved
                    self._recv_done(rid, why)
                continue
            msg = json.loads(self.store.get(key))
            self.store.delete_key(key)
            del self._waiting[(peer, seq)]
            if not msg.get("ok"):
                self._recv_done(rid, msg.get("error") or NO_KV)
                continue
            path = msg["path"]
            try:
                data = _read(path, int(msg["nbytes"]))
            except (OSError, RuntimeError, ValueError) as e:
                self._recv_done(rid, f"shared memory read failed: {_short(e)}")
                continue
            finally:
                _unlink(path)
            self._recv_done(rid, None, [int(h) for h in msg["hashes"]], data)

    def _decode_gone(self, link: Link) -> None:
        for path, (_, peer) in list(self._files.items()):
            if peer == link:
                _unlink(path)
                del self._files[path]

    def has_pending(self) -> bool:
        return super().has_pending() or bool(self._files)

    def close(self) -> None:
        for path in list(self._files):
            _unlink(path)
        self._files.clear()
        super().close()


def remove_stale_files(directory: str) -> int:
    """Remove the hand-over files of prefill engines that died before their reader came (each
    file's name carries its writer's pid). Returns how many were removed."""
    n = 0
    for name in os.listdir(directory):
        if not name.startswith(_PREFIX):
            continue
        try:
            pid = int(name[len(_PREFIX):].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            _unlink(os.path.join(directory, name))
            n += 1
        except (ValueError, PermissionError):
            pass
    return n


def _read(path: str, nbytes: int) -> torch.Tensor:
    size = os.path.getsize(path)
    if size != nbytes:
        raise ValueError(f"file holds {size} bytes, the prefill side announced {nbytes}")
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(path, shared=False, size=nbytes, dtype=torch.uint8)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
