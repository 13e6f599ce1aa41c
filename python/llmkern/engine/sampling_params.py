"""SamplingParams: how one request is decoded. Validated on construction; every error names the
field, what was expected and what came."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence, Union


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
    stop_list: List[str] = field(init=False, repr=False)

    def __post_init__(self):
        self.stop_list = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def _validate(self) -> None:
        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        def bad(name, expected):
            raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

        if not is_int(self.n) or self.n < 1:
            bad("n", "an integer >= 1")
        if not is_num(self.temperature) or self.temperature < 0:
            bad("temperature", "a finite number >= 0 (0 = greedy)")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "an integer >= 1, or 0 / -1 for no top-k")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "a number in (0, 1]")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1]")
        if not is_num(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad("repetition_penalty", "a number > 0 (1 = off)")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not is_num(v) or not -2 <= v <= 2:
                bad(name, "a number in [-2, 2]")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 0):
            bad("max_tokens", "an integer >= 0 or None")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens: must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if not all(isinstance(s, str) and s for s in self.stop_list):
            bad("stop", "a non-empty string or a list of non-empty strings")
        if not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of non-negative token ids")
        if self.seed is not None and not is_int(self.seed):
            bad("seed", "an integer or None")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            bad("logprobs", "an integer in [0, 20] or None")

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        """From a JSON-style dict; unknown keys are an error (they would be silently ignored)."""
        names = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"sampling: unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        return cls(**d)
