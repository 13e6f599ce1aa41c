"""Scheduler: which sequences run this step and how many tokens each.

Continuous policy, per step under a token budget (max_num_batched_tokens) and a sequence cap
(max_num_seqs):
  1. running sequences, decodes first, then unfinished (chunked) prefills; if the KV pool is
     short, the most recently admitted running sequence is preempted (recompute: its blocks are
     freed and it restarts from its tokens; swap: its blocks move to host memory);
  2. swapped sequences come back when their blocks fit;
  3. waiting sequences are admitted in arrival order, starting after their cached prefix; with
     chunked prefill the last admitted one may get only part of its prompt. One whose prefix a
     running sequence is still computing is passed over until it is cached (computed once; SGLang
     does the same within a batch). With schedule="throughput" (offline work) the queue is ordered
     by admission.py's rules instead: prefix groups together, biggest first.
While a long prompt is prefilled in chunks, short waiting prompts (together within
short_prompt_share of the budget) join each step beside its next chunk (_short_prompt_reserve).
With decode_defer_steps = n > 0, a step in which a prompt completes leaves the running decodes
for the next step, at most n steps in a row (new requests' first tokens come sooner; _defer_decodes).
Static policy: admit up to max_num_seqs, run that batch to completion, then admit the next.
Dynamic policy: static, but a batch starts only when max_num_seqs sequences wait or the oldest
has waited max_wait_ms (the batch forms while the previous one runs).
Queue order (policy "fcfs"): arrival; (policy "priority"): Request.priority, then arrival, and
the preemption victim is the lowest-priority running sequence instead of the newest one."""
from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List

from . import admission
from .config import EngineConfig
from .kv_cache_manager import KVCacheManager
from .sequence import Sequence, SeqStatus


@dataclass
class ScheduledBatch:
    decodes: List[Sequence] = field(default_factory=list)        # one new token each
    prefills: List[Sequence] = field(default_factory=list)       # a chunk each
    prefill_lens: List[int] = field(default_factory=list)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(self.prefill_lens)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: Deque[Sequence] = deque()
        self.running: List[Sequence] = []       # admission order (last = lowest priority)
        self.swapped: Deque[Sequence] = deque()
        self.num_preemptions = 0
        self._unordered = False  # throughput schedule: the waiting queue needs sorting
        # Sequences of micro-batches still in the pipeline (pipeline parallelism): their next token
        # is not known yet, so they are neither scheduled nor preempted until their step completes.
        self.busy: set = set()
        self._deferred = 0   # steps in a row whose decodes were deferred (decode_defer_steps)
        self.budget = config.max_num_batched_tokens
        if not config.enable_chunked_prefill:
            # A whole prompt must fit in one step.
            self.budget = max(self.budget, max_model_len)

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self._enqueue(seq, front=False)
        self._unordered = True

    def _enqueue(self, seq: Sequence, front: bool) -> None:
        if self.config.policy == "priority":
            keys = [s.priority_key for s in self.waiting]
            self.waiting.insert(bisect.bisect(keys, seq.priority_key), seq)
        elif front:
            self.waiting.appendleft(seq)   # a preempted sequence goes back to the head
        else:
            self.waiting.append(seq)

    def ready_in(self, now: float) -> float:
        """Seconds until schedule() would have work: 0 when it has some now, the time left until
        a dynamic batch is due while one forms, inf when there is nothing to do."""
        if self.running or self.swapped:
            return 0.0
        if not self.waiting:
            return float("inf")
        if self.config.scheduler != "dynamic" or len(self.waiting) >= self.config.max_num_seqs:
            return 0.0
        oldest = min(s.request.arrival_time for s in self.waiting)
        return max(0.0, oldest + self.config.max_wait_ms / 1e3 - now)

    def expired(self, now: float) -> List[Sequence]:
        """Waiting sequences of requests that never started and whose queue deadline passed."""
        return [s for s in self.waiting if s.request.queue_deadline is not None
                and s.request.first_scheduled_time is None and now > s.request.queue_deadline]

    def num_prefill_tokens_pending(self) -> int:
        """Prompt tokens still to compute (queued and partly prefilled): the work ahead of a new
        request's first token. A waiting sequence counts without the prefix it would find cached
        now (a router weighing a queue against a cache miss must not count the hit as work)."""
        running = sum(s.num_tokens - s.num_computed_tokens for s in self.running
                      if s.num_computed_tokens < s.num_tokens - 1)
        waiting = sum(s.num_tokens - max(s.num_computed_tokens, self.kv.cached_prefix_tokens(s))
                      for s in self.waiting if s.num_computed_tokens < s.num_tokens - 1)
        return running + waiting

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # -- the step plan --------------------------------------------------------------------------
    def schedule(self, max_seqs: int = None) -> ScheduledBatch:
        """max_seqs: at most this many sequences in the batch (pipeline parallelism splits the
        running sequences over its micro-batches)."""
        batch = ScheduledBatch()
        cap = max_seqs if max_seqs is not None else float("inf")
        budget = self.budget
        scheduled = set()
        chunked = self.config.enable_chunked_prefill
        if (self.config.scheduler != "continuous" and not self.running and not self.swapped
                and self.ready_in(time.perf_counter()) == 0):
            self._admit_static_batch()

        # 1. running: decodes first, then partial prefills (leaving `reserve` for short new prompts).
        order = ([s for s in self.running if s.num_computed_tokens >= s.num_tokens - 1]
                 + [s for s in self.running if s.num_computed_tokens < s.num_tokens - 1])
        reserve = self._short_prompt_reserve() if chunked else 0
        for seq in order:
            if budget <= 0 or len(batch.decodes) + len(batch.prefills) >= cap:
                break
            if seq.status is not SeqStatus.RUNNING or seq.seq_id in self.busy:
                continue  # preempted earlier in this loop, or still in the pipeline
            n = seq.num_tokens - seq.num_computed_tokens
            if n == 1 and seq.spec_token_ids:
                # Speculative drafts ride along with the decode; they are the first thing dropped
                # when the budget or the pool is short.
                k = min(len(seq.spec_token_ids), budget - 1)
                if k and not self.kv.can_allocate(seq, 1 + k):
                    k = 0
                del seq.spec_token_ids[k:]
                n += k
            if reserve and n > budget - reserve and seq.num_computed_tokens < seq.num_tokens - 1:
                n = max(1, budget - reserve)   # a long prompt's next chunk leaves room for short ones
            if n > budget:
                if not chunked:
                    continue
                n = budget
            while not self.kv.allocate_slots(seq, n):
                victim = self._pick_victim(scheduled)
                self._preempt(victim, batch)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue
            scheduled.add(seq.seq_id)
            budget -= n
            if n == 1 and seq.num_computed_tokens == seq.num_tokens - 1:
                batch.decodes.append(seq)
            else:
                batch.prefills.append(seq)
                batch.prefill_lens.append(n)

        if batch.num_preempted:
            return batch  # the pool is under pressure: admit nothing new this step

        # 2. swapped sequences back in (they decode right away).
        while (self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs
               and len(batch.decodes) + len(batch.prefills) < cap):
            seq = self.swapped[0]
            n = seq.num_tokens - seq.num_computed_tokens
            if n > budget or not self.kv.can_swap_in(seq, n):
                break
            self.swapped.popleft()
            self.kv.swap_in(seq)
            if not self.kv.allocate_slots(seq, n):  # cannot fail: checked above
                raise RuntimeError("scheduler: swap-in accounting error")
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            scheduled.add(seq.seq_id)
            budget -= n
            if n == 1:
                batch.decodes.append(seq)
            else:
                batch.prefills.append(seq)
                batch.prefill_lens.append(n)
        if self.swapped:
            return batch  # swapped sequences have priority over new ones

        # 3. waiting sequences.
        if self.config.scheduler != "continuous":
            return batch
        throughput = self.config.schedule == "throughput"
        if throughput and self._unordered:
            self.waiting = deque(admission.throughput_order(self.waiting, self.kv.block_size, self.max_model_len))
            self._unordered = False
        # A prompt whose prefix another running sequence is computing right now waits for it to be
        # cached instead of computing it again (a burst of one system prompt); later prompts go ahead.
        inflight = (admission.inflight_hashes(self.running, self.kv.block_size)
                    if self.kv.enable_prefix_caching and self.waiting else set())
        i = 0  # requests waiting for an in-flight prefix are passed over, not blocking
        while (i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs
               and len(batch.decodes) + len(batch.prefills) < cap):
            seq = self.waiting[i]
            if inflight and admission.waits_for_inflight(seq, inflight, self.kv.block_size):
                i += 1
                continue
            if seq.num_computed_tokens == 0 and not seq.block_ids:
                self.kv.acquire_prefix(seq)
            n = seq.num_tokens - seq.num_computed_tokens
            if n > budget:
                if not chunked and n <= self.budget:
                    self._release_prefix(seq)
                    break
                n = budget
            if not self.kv.allocate_slots(seq, n):
                self._release_prefix(seq)
                break
            del self.waiting[i]
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = time.perf_counter()
            budget -= n
            batch.prefills.append(seq)
            batch.prefill_lens.append(n)
            if self.kv.enable_prefix_caching:
                inflight.update(admission.prompt_hashes(seq, self.kv.block_size)[seq.num_cached_blocks:])
        return self._defer_decodes(batch, pipelined=max_seqs is not None)

    def _short_prompt_reserve(self) -> int:
        """While a long prompt is prefilled in chunks, the waiting prompts at the head of the queue
        that fit whole into config.short_prompt_share of the budget (together) are admitted in this
        step beside its next chunk, rather than after its last: a chat turn does not wait seconds
        behind a document. Returns the tokens to keep for them (0: nothing to keep)."""
        share = int(self.budget * self.config.short_prompt_share)
        if not share or self.config.schedule != "arrival" or not self.waiting or not any(
                s.num_computed_tokens < s.num_tokens - 1 for s in self.running):
            return 0
        total = 0
        for seq in self.waiting:
            n = seq.num_tokens - seq.num_computed_tokens
            if total + n > share:
                break
            total += n
        return total

    def _defer_decodes(self, batch: ScheduledBatch, pipelined: bool) -> ScheduledBatch:
        """Bounded decode deferral (config.decode_defer_steps = n): a step in which some prompt
        completes runs without the running decodes, at most n steps in a row. The new request's
        first token then costs only its prefill, and the decodes lose nothing: mixed in, they would
        have waited for the same prefill; alone after it they pay one more step's fixed cost (the
        weight read). Their KV slots stay allocated for the next step."""
        if not batch.decodes:
            return batch
        first_tokens = any(n == s.num_tokens - s.num_computed_tokens
                           for s, n in zip(batch.prefills, batch.prefill_lens))
        if (first_tokens and self._deferred < self.config.decode_defer_steps and not pipelined
                and self.config.speculative is None):
            batch.decodes = []
            self._deferred += 1
        else:
            self._deferred = 0
        return batch

    def admit_loaded(self, seq: Sequence) -> None:
        """A sequence whose KV arrived from a prefill engine (blocks allocated and filled) joins
        the running ones; it decodes from the next step on."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        if seq.request.first_scheduled_time is None:
            seq.request.first_scheduled_time = time.perf_counter()

    def _admit_static_batch(self) -> None:
        # The whole batch enters at once; its prompts are then prefilled in budget-sized chunks
        # by the running loop, and nothing else is admitted until every member has finished.
        now = time.perf_counter()
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            if seq.num_computed_tokens == 0 and not seq.block_ids:
                self.kv.acquire_prefix(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = now

    def _release_prefix(self, seq: Sequence) -> None:
        """Undo acquire_prefix for a sequence that stays waiting (its hits stay cached)."""
        self.kv.free(seq)
        seq.num_computed_tokens = 0

    def _pick_victim(self, scheduled: set) -> Sequence:
        # The most recently admitted (policy "priority": the lowest-priority) running sequence; it
        # may be one already scheduled this step only if nothing else is left (then the step
        # shrinks accordingly).
        free = [s for s in self.running if s.seq_id not in self.busy]  # never one in the pipeline
        if self.config.policy == "priority":
            rest = [s for s in free if s.seq_id not in scheduled]
            return max(rest or free, key=lambda s: s.priority_key)
        for seq in reversed(free):
            if seq.seq_id not in scheduled:
                return seq
        return free[-1]

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        if seq in batch.decodes:
            batch.decodes.remove(seq)
        elif seq in batch.prefills:
            i = batch.prefills.index(seq)
            del batch.prefills[i]
            del batch.prefill_lens[i]
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.num_preempted += 1
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(seq):
            self.kv.swap_out(seq)
            seq.status = SeqStatus.SWAPPED
            self.swapped.append(seq)
        else:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SeqStatus.WAITING
            self._enqueue(seq, front=True)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished (or aborted) sequence from every queue and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SeqStatus.FINISHED
