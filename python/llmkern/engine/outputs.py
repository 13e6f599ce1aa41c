"""What generation returns: per-request results with per-sample completions and metrics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_prompt_tokens: int = 0     # prompt tokens served by the prefix cache
    num_preemptions: int = 0
    # seconds, first sample; a step that commits k tokens (speculation) counts its gap / k for each
    inter_token_latencies: List[float] = field(default_factory=list)
    kv_transfer_bytes: int = 0            # decode role: KV bytes received for this request
    kv_transfer_s: float = 0.0            # ... and the transfer's wall time

    @property
    def ttft(self) -> Optional[float]:
        """Time to first token (seconds), from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> Optional[float]:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> Optional[float]:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str] = None   # "stop" | "length" | "abort" | None while running
    stop_reason: Union[None, int, str] = None  # the stop string / stop token id that matched
    delta_text: str = ""                  # streaming: text added by this step
    delta_token_ids: List[int] = field(default_factory=list)
    # With SamplingParams.logprobs: per output token (logprob of the token, [(token id, logprob)] of
    # the most likely ones); delta_logprobs for the tokens of delta_token_ids.
    logprobs: Optional[list] = None
    delta_logprobs: Optional[list] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    error: Optional[str] = None           # set when the request was rejected or failed
    # prefill role: KVTransferParams.to_dict() of a finished request (what a decode engine needs)
    kv_transfer_params: Optional[dict] = None
    # With SamplingParams.prompt_logprobs: per prompt token, None for the first, then (logprob of the
    # token, [(token id, logprob)] of the most likely ones) given the tokens before it
    prompt_logprobs: Optional[list] = None

    # Shortcuts to the first sample (the only one unless n > 1).
    @property
    def text(self) -> str:
        return self.outputs[0].text if self.outputs else ""

    @property
    def token_ids(self) -> List[int]:
        return self.outputs[0].token_ids if self.outputs else []

    @property
    def finish_reason(self) -> Optional[str]:
        return self.outputs[0].finish_reason if self.outputs else ("error" if self.error else None)


@dataclass
class EmbeddingOutput:
    embedding: List[float]


@dataclass
class EmbeddingRequestOutput:
    """LLM.embed's result for one input (vLLM's shape: `.outputs.embedding`)."""
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: List[int]
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float                   # log-likelihood of the continuation: sum of token_logprobs
    token_logprobs: List[float]    # log p(continuation token | everything before it)
    is_greedy: bool                # every continuation token is the argmax at its position


@dataclass
class ScoringRequestOutput:
    """LLM.score's result for one (prompt, continuation) pair (vLLM's shape: `.outputs.score`)."""
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: List[int]
    continuation_token_ids: List[int]
    finished: bool = True
