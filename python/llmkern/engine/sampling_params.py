"""SamplingParams: how one request is decoded. Validated on construction (param_checks: at the
type the kernels store); every error is a ValueError naming the field, what was expected and what came."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence, Union

from . import param_checks
from .structured_params import StructuredOutputsParams

MAX_LOGPROBS = 20     # alternatives per token, as OpenAI


@dataclass
class SamplingParams:
    n: int = 1                          # independent samples per prompt
    temperature: float = 1.0            # 0 = greedy
    top_k: int = 0                      # 0 or -1 = off; above the vocabulary size: clamped to it
    top_p: float = 1.0                  # (0, 1]
    min_p: float = 0.0                  # [0, 1]
    repetition_penalty: float = 1.0     # > 0; HF-style, over prompt and output tokens
    frequency_penalty: float = 0.0      # [-2, 2]; OpenAI-style, over output tokens
    presence_penalty: float = 0.0       # [-2, 2]
    max_tokens: Optional[int] = 16      # None = up to the model's context
    min_tokens: int = 0                 # EOS / stop tokens are masked until this many
    stop: Union[None, str, Sequence[str]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    seed: Optional[int] = None
    skip_special_tokens: bool = True
    logprobs: Optional[int] = None      # None = off; k >= 0: the sampled token's log-probability and the k most likely
    prompt_logprobs: Optional[int] = None   # the same for every prompt token after the first
    logit_bias: Optional[Dict[int, float]] = None   # token id -> added to its logit, in [-100, 100] (OpenAI's)
    structured_outputs: Union[None, dict, StructuredOutputsParams] = None   # what the output must match
    stop_list: List[str] = field(init=False, repr=False)

    def __post_init__(self):
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def validate(self) -> None:
        """Every field checked (and normalised: 4.0 -> 4) at the type the engine stores it as."""
        c = param_checks
        self.n = c.as_int("n", self.n, 1, c.INT64_MAX, "an integer >= 1")
        self.temperature = c.as_f32("temperature", self.temperature, 0.0, math.inf,
                                    "a finite number >= 0 (0 = greedy)")
        # int64: the sampler clamps it to the vocabulary before the kernels' int32 (as vLLM does)
        self.top_k = c.as_int("top_k", self.top_k, -1, c.INT64_MAX, "an integer >= 1 (a 64-bit integer), "
                                                                     "or 0 / -1 for no top-k")
        self.top_p = c.as_f32("top_p", self.top_p, 0.0, 1.0, "a number in (0, 1]", lo_open=True)
        self.min_p = c.as_f32("min_p", self.min_p, 0.0, 1.0, "a number in [0, 1]")
        self.repetition_penalty = c.as_f32("repetition_penalty", self.repetition_penalty, 0.0, math.inf,
                                           "a finite number > 0 (1 = off)", lo_open=True)
        for name in ("frequency_penalty", "presence_penalty"):
            setattr(self, name, c.as_f32(name, getattr(self, name), -2.0, 2.0, "a number in [-2, 2]"))
        if self.max_tokens is not None:
            self.max_tokens = c.as_int("max_tokens", self.max_tokens, 1, c.INT64_MAX, "an integer >= 1 or None")
        self.min_tokens = c.as_int("min_tokens", self.min_tokens, 0, c.INT64_MAX, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise c.ParamError("min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        self.stop_list = c.stop_strings(self.stop)
        self.stop_token_ids = c.token_ids("stop_token_ids", [] if self.stop_token_ids is None else self.stop_token_ids)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            c.as_bool(name, getattr(self, name))
        if self.seed is not None:
            self.seed = c.as_int("seed", self.seed, c.INT64_MIN, c.INT64_MAX, "a 64-bit integer or None")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                setattr(self, name, c.as_int(name, getattr(self, name), 0, MAX_LOGPROBS,
                                             f"an integer in [0, {MAX_LOGPROBS}] or None"))
        if self.logit_bias is not None:
            self.logit_bias = c.logit_bias(self.logit_bias)
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs)

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        """From a JSON-style dict; unknown keys are an error (they would be silently ignored)."""
        names = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(d) - names)
        if unknown:
            also = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
            raise param_checks.ParamError(unknown[0], f"unknown parameter{also}; known: {', '.join(sorted(names))}")
        return cls(**d)
