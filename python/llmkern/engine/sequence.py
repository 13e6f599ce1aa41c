"""Per-sequence state: tokens, progress through the KV cache, blocks, sampling state, timings.

A request with n samples owns n sequences that share the prompt (and, with prefix caching, its
KV blocks)."""
from __future__ import annotations

import enum
import time
from typing import List, Optional

import torch

from .sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"      # not started, or preempted by recompute
    RUNNING = "running"
    SWAPPED = "swapped"      # preempted by swap: KV in host memory
    FINISHED = "finished"


class Sequence:
    __slots__ = (
        "seq_id", "request", "index", "token_ids", "num_prompt_tokens", "num_computed_tokens",
        "block_ids", "num_cached_blocks", "block_hashes", "block_regs", "status", "finish_reason", "stop_reason",
        "generator", "swap_blocks", "detok", "num_preemptions", "first_token_time", "token_times",
        "finish_time", "prompt_cache_hit_tokens", "output_text", "stream_offset", "text_sent",
        "spec_token_ids", "logprobs",
    )

    def __init__(self, seq_id: int, request: "Request", index: int, generator: Optional[torch.Generator]):
        self.seq_id = seq_id
        self.request = request
        self.index = index
        self.token_ids: List[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.num_computed_tokens = 0
        self.block_ids: List[int] = []
        self.num_cached_blocks = 0          # leading blocks already registered in the prefix cache
        self.block_hashes: List[int] = []   # chained hashes of the full blocks of token_ids
        self.block_regs: List[int] = []     # prefix-cache identity of each cached leading block
        self.status = SeqStatus.WAITING
        self.finish_reason: Optional[str] = None
        self.stop_reason = None
        self.generator = generator
        self.swap_blocks: List[int] = []    # host blocks while SWAPPED
        self.detok = None
        self.num_preemptions = 0
        self.first_token_time: Optional[float] = None
        self.token_times: List[float] = []
        self.finish_time: Optional[float] = None
        self.prompt_cache_hit_tokens = 0
        self.output_text = ""
        self.stream_offset = 0              # output tokens already reported by step()
        self.text_sent = 0                  # characters of output_text already reported
        self.spec_token_ids: List[int] = []  # speculative drafts to verify after the last token
        self.logprobs: Optional[list] = [] if request.params.logprobs is not None else None  # per output token

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def priority_key(self) -> tuple:
        """Queue order under the priority policy: priority, then arrival, then sample index."""
        return (self.request.priority, self.request.arrival_time, self.seq_id)

    @property
    def output_token_ids(self) -> List[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def append_token(self, tok: int, now: float) -> None:
        self.token_ids.append(tok)
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)


class Request:
    """What the caller submitted: prompt, params, its sequences and timestamps."""

    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: List[int],
                 params: SamplingParams, arrival_time: Optional[float] = None, priority: int = 0,
                 queue_deadline: Optional[float] = None):
        self.request_id = request_id
        self.priority = priority               # policy "priority": lower runs first, preempted last
        self.queue_deadline = queue_deadline   # perf_counter time after which it may not start
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = arrival_time if arrival_time is not None else time.perf_counter()
        self.first_scheduled_time: Optional[float] = None
        self.seqs: List[Sequence] = []
        self.error: Optional[str] = None               # why it failed (finish_reason "error")
        self.kv_transfer_params: Optional[dict] = None  # prefill role: the hand-over, once finished
        self.kv_transfer = None                        # decode role: (KV bytes received, seconds)
        self.prompt_logprobs: Optional[list] = None    # with params.prompt_logprobs (prefill_tasks)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)
