"""The engine's part of prefill-decode hand-over (see pd/interface.py for the roles and contracts):
pinning a finished prefill's blocks until its send ends, and on the decode side allocating,
loading and admitting requests that arrive with kv_transfer_params. Blocks are only ever taken
and given back through the KVCacheManager."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .block_pool import chain_block_hashes
from ..pd.interface import (KVConnector, KVTransferParams, LoadRequest, SendRequest, TransferEvent,
                          TransferState, TransferStats, now)
from .sampling_params import SamplingParams
from .sequence import Sequence


@dataclass
class _Pinned:
    block_ids: List[int]
    deadline: float


@dataclass
class _Loading:
    seq: Sequence
    params: KVTransferParams
    deadline: float
    started: bool = False


class KVHandover:
    def __init__(self, role: str, connector: KVConnector, kv, timeout_s: float, fallback: str):
        self.role = role
        self.connector = connector
        self.kv = kv
        self.timeout_s = timeout_s
        self.fallback = fallback
        self.stats = TransferStats()
        self.pinned: Dict[str, _Pinned] = {}      # prefill: request id -> blocks held for the send
        self.loading: Dict[str, _Loading] = {}    # decode: request id -> waiting for KV
        connector.bind(role, kv.caches, kv.block_size)

    # -- prefill side ---------------------------------------------------------------------------
    def prefill_params(self, params: SamplingParams) -> SamplingParams:
        """A prefill engine samples the first token only."""
        if params.n != 1:
            raise ValueError(f"n: a prefill engine takes n=1 requests only, got {params.n}")
        return dataclasses.replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))

    def on_prefill_finished(self, seq: Sequence) -> dict:
        """Called before the finished sequence's blocks are released: pin them for the hand-over,
        tell the connector; returns the KVTransferParams dict for the request's output."""
        bs = self.kv.block_size
        n_tok = seq.num_prompt_tokens
        blocks = list(seq.block_ids[:-(-n_tok // bs)])
        self.kv.pin(blocks)
        deadline = now() + self.timeout_s
        rid = seq.request.request_id
        hashes = chain_block_hashes(seq.token_ids[:n_tok], bs, seq.block_hashes[:n_tok // bs])
        self.pinned[rid] = _Pinned(blocks, deadline)
        lps = None
        if seq.logprobs:
            lp, top = seq.logprobs[0]
            lps = [lp, [list(t) for t in top]]
        self.connector.request_finished(SendRequest(rid, blocks, hashes, n_tok, deadline))
        return KVTransferParams(
            engine_id=self.connector.engine_id, engine_rank=self.connector.engine_rank, request_id=rid,
            prompt_token_ids=list(seq.token_ids[:n_tok]), num_tokens=n_tok, block_hashes=hashes,
            block_size=bs, kv_block_bytes=self.connector.block_bytes, kv_dtype=self.connector.kv_dtype,
            first_token=seq.token_ids[n_tok], expires_at=deadline, first_token_logprobs=lps).to_dict()

    def _unpin(self, rid: str) -> None:
        p = self.pinned.pop(rid, None)
        if p is not None:
            self.kv.unpin(p.block_ids)

    # -- decode side ----------------------------------------------------------------------------
    def check_params(self, raw, prompt_ids: List[int], params: SamplingParams) -> KVTransferParams:
        """Validate kv_transfer_params for a request with these prompt ids; ValueError if unusable."""
        p = KVTransferParams.from_dict(raw)
        if params.n != 1:
            raise ValueError(f"n: a request with kv_transfer_params must have n=1, got {params.n}")
        if p.prompt_token_ids != list(prompt_ids):
            raise ValueError("kv_transfer_params: prompt_token_ids differ from this request's prompt")
        if p.block_size != self.kv.block_size:
            raise ValueError(f"kv_transfer_params: block_size {p.block_size}, this engine uses {self.kv.block_size}")
        if (p.kv_block_bytes, p.kv_dtype) != (self.connector.block_bytes, self.connector.kv_dtype):
            raise ValueError(f"kv_transfer_params: KV blocks of {p.kv_block_bytes} bytes ({p.kv_dtype}), this "
                             f"engine's are {self.connector.block_bytes} bytes ({self.connector.kv_dtype}): "
                             f"not the same model or dtype")
        mine = chain_block_hashes(prompt_ids, p.block_size)
        if mine != p.block_hashes:
            raise ValueError("kv_transfer_params: block_hashes do not match the prompt (another hash function?)")
        why = self.connector.can_reach(p)
        if why is not None:
            raise ValueError(f"kv_transfer_params: engine {p.engine_id!r} is not reachable: {why}")
        left = p.expires_at - now()
        if left <= 0:
            raise ValueError(f"kv_transfer_params: expired {-left:.1f} s ago (the prefill engine released the KV)")
        return p

    def add_loading(self, seq: Sequence, p: KVTransferParams) -> None:
        deadline = min(p.expires_at, now() + self.timeout_s)
        self.loading[seq.request.request_id] = _Loading(seq, p, deadline)

    def _start(self, ld: _Loading) -> bool:
        """Allocate the request's blocks (prefix hits first) and start the load; False if the pool
        is short now (it stays queued)."""
        seq, kv = ld.seq, self.kv
        kv.acquire_prefix(seq)
        if not kv.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens):
            kv.free(seq)
            seq.num_computed_tokens = 0
            return False
        ld.started = True
        n_local = seq.num_computed_tokens // kv.block_size
        self.connector.start_load(LoadRequest(seq.request.request_id, ld.params, list(seq.block_ids),
                                              n_local, ld.deadline))
        return True

    # -- every step -----------------------------------------------------------------------------
    def step(self) -> Tuple[List[Tuple[Sequence, KVTransferParams, TransferEvent]], List[Tuple[Sequence, str]]]:
        """Poll the connector and the deadlines. Returns (sequences whose KV arrived, with their
        params and event; sequences that failed, with the reason)."""
        arrived, failed = [], []
        events = self.connector.poll()
        t = now()
        for ev in events:
            self.stats.record(ev)
            if ev.direction == "send":
                self._unpin(ev.request_id)
                continue
            ld = self.loading.pop(ev.request_id, None)
            if ld is None:
                continue
            if ev.state is TransferState.DONE:
                ld.seq.request.kv_transfer = (ev.nbytes, ev.seconds)
                arrived.append((ld.seq, ld.params, ev))
            else:
                failed.append((ld.seq, f"KV transfer from {ld.params.engine_id} failed: {ev.error}"))
        for rid, p in list(self.pinned.items()):
            if t > p.deadline:  # the decode side never took it: give the blocks back
                self.connector.abort(rid)
                self._unpin(rid)
                self.stats.sends_failed += 1
        for rid, ld in list(self.loading.items()):
            if t > ld.deadline:
                self.connector.abort(rid)
                del self.loading[rid]
                self.stats.recvs_failed += 1
                failed.append((ld.seq, f"KV transfer from {ld.params.engine_id} not complete within its deadline "
                                       f"(kv_transfer_timeout_s={self.timeout_s:g})"))
        for ld in self.loading.values():
            if not ld.started and not self._start(ld):
                break  # first come first served: later ones wait too
        return arrived, failed

    def forget(self, seq: Sequence) -> None:
        """A waiting-for-KV sequence finishes (abort, failure): stop its load before the engine
        frees its blocks."""
        rid = seq.request.request_id
        if self.loading.pop(rid, None) is not None:
            self.connector.abort(rid)

    def abort(self, rid: str) -> bool:
        """Prefill side: drop a pinned hand-over. Returns whether there was one."""
        if rid not in self.pinned:
            return False
        self.connector.abort(rid)
        self._unpin(rid)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.pinned or self.loading or self.connector.has_pending())

    def stats_fields(self) -> dict:
        """The hand-over's EngineStats fields."""
        t = self.stats
        return dict(kv_bytes_sent=t.bytes_sent, kv_bytes_received=t.bytes_received,
                    kv_transfer_seconds_sent=t.seconds_sent, kv_transfer_seconds_received=t.seconds_received,
                    kv_transfers_done=t.sends_done + t.recvs_done, kv_transfers_failed=t.sends_failed + t.recvs_failed,
                    kv_blocks_pinned=self.num_pinned_blocks(), num_waiting_for_kv=len(self.loading))

    def num_pinned_blocks(self) -> int:
        return sum(len(p.block_ids) for p in self.pinned.values())

    def close(self) -> None:
        for rid in list(self.pinned):
            self.abort(rid)
        for rid in list(self.loading):
            self.connector.abort(rid)
        self.connector.close()


POLL_INTERVAL_S = 0.002  # how often an otherwise idle engine polls transfers


def admit_transfers(engine) -> List[Sequence]:
    """One hand-over poll of `engine`. Decode side: admit the requests whose KV arrived (they continue from the prefill's
    first token), fail or recompute those whose transfer failed. Prefill side: release the
    blocks of finished sends. Returns the sequences that changed."""
    arrived, failed = engine.handover.step()
    now = time.perf_counter()
    out = []
    for seq, err in failed:
        out.append(seq)
        if engine.config.kv_transfer_fallback == "recompute":  # co-located retry: prefill it here
            engine.kv.free(seq)
            seq.num_computed_tokens = 0
            engine.scheduler.add(seq)
        else:
            seq.request.error = err
            engine._finish(seq, "error", now)
    for seq, p, ev in arrived:
        seq.num_computed_tokens = seq.num_prompt_tokens
        engine.kv.cache_blocks(seq)
        engine.scheduler.admit_loaded(seq)
        seq.append_token(p.first_token, now)
        if seq.logprobs is not None:  # the prefill side's, when it was asked for them
            lp = p.first_token_logprobs or [float("nan"), []]
            seq.logprobs.append((lp[0], [tuple(t) for t in lp[1]]))
        engine._check_stop(seq, p.first_token, now)
        out.append(seq)
    return out
