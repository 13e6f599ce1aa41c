"""SpecConfig: speculative-decoding settings, from a dict (``LLM(speculative={...})``) or from the
CLI's compact form ``METHOD[:K][,key=value...]`` (``ngram:4``, ``early_exit:3,num_layers=12``,
``draft:4,model=path/to/draft``). Validated up front; errors name the field."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

METHODS = ("ngram", "draft", "early_exit")


@dataclass
class SpecConfig:
    method: str
    num_speculative_tokens: int = 4      # drafts proposed per sequence and step (k)
    # ngram (prompt lookup): match the longest context suffix of prompt_lookup_max..min tokens
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # draft: a smaller model with the target's vocabulary (HF directory, .gguf, or a config for
    # load_format="dummy")
    model: Any = None
    load_format: str = "auto"
    seed: int = 0                        # dummy draft weights
    # early_exit: the target's first num_layers layers + its final norm and LM head
    num_layers: Optional[int] = None     # default: half the target's layers
    # Speculation is skipped in steps where more sequences decode than this: verification runs
    # (1 + k) rows per sequence, and once the batch's rows make the step compute-bound (CPU)
    # drafts cost more than they save. Measured on SmolLM2 / 2 CPU cores: n-gram speculation
    # still gains ~1.15x at 16 decoding sequences. None = never skip.
    disable_by_batch_size: Optional[int] = 16

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"speculative.{name}: expected {expected}, got {getattr(self, name)!r}")

        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        if self.method not in METHODS:
            bad("method", f"one of {', '.join(METHODS)}")
        if not is_int(self.num_speculative_tokens) or not 1 <= self.num_speculative_tokens <= 64:
            bad("num_speculative_tokens", "an integer in [1, 64]")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad(name, "an integer >= 1")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative.prompt_lookup_min: must be <= prompt_lookup_max "
                             f"({self.prompt_lookup_max}), got {self.prompt_lookup_min}")
        if self.method == "draft" and self.model is None:
            bad("model", "a draft model (HF directory, .gguf file, or a config with load_format='dummy')")
        if self.num_layers is not None and (not is_int(self.num_layers) or self.num_layers < 1):
            bad("num_layers", "an integer >= 1")
        if self.disable_by_batch_size is not None and (
                not is_int(self.disable_by_batch_size) or self.disable_by_batch_size < 1):
            bad("disable_by_batch_size", "an integer >= 1 or None")
        if self.load_format not in ("auto", "hf", "gguf", "dummy"):
            bad("load_format", "one of auto, hf, gguf, dummy")

    @classmethod
    def parse(cls, spec) -> "SpecConfig":
        """From a SpecConfig, a dict with a "method" key, or a string METHOD[:K][,key=value...]."""
        if isinstance(spec, SpecConfig):
            return spec
        if isinstance(spec, str):
            return cls.parse(_parse_string(spec))
        if not isinstance(spec, dict):
            raise TypeError(f"speculative: expected a dict, a string or None, got {type(spec).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - names)
        if unknown:
            raise ValueError(f"speculative: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        if "method" not in spec:
            raise ValueError(f"speculative: needs a 'method' ({', '.join(METHODS)})")
        return cls(**spec)


def _parse_string(s: str) -> dict:
    head, *rest = [p.strip() for p in s.split(",")]
    method, _, k = head.partition(":")
    d: dict = {"method": method.strip()}
    if k:
        if not k.strip().isdigit():
            raise ValueError(f"speculative: expected METHOD[:K][,key=value...], got {s!r}")
        d["num_speculative_tokens"] = int(k)
    for item in rest:
        key, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"speculative: expected key=value after the method, got {item!r} in {s!r}")
        val = val.strip()
        d[key.strip()] = None if val.lower() == "none" else int(val) if val.isdigit() else val
    return d
