"""ModelConfig: the architecture facts the runtime needs, read from a HF config.json dict or from
GGUF metadata, for the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
_REQUIRED = object()


def _int_field(d: dict, key: str, default=_REQUIRED) -> Optional[int]:
    """d[key] as an integer >= 1; a missing required key, a non-integer or a value < 1 is a ValueError
    naming the key (a 0 head count would otherwise surface as a ZeroDivisionError)."""
    v = d.get(key)
    if v is None:
        if default is _REQUIRED:
            raise ValueError(f"{key}: missing")
        return default
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{key}: expected an integer >= 1, got {v!r}")
    return int(v)


def _float_field(d: dict, key: str, default: float) -> float:
    v = d.get(key, default)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{key}: expected a number > 0, got {v!r}")
    return float(v)


def _divided(total: int, parts: int, total_key: str, parts_key: str) -> int:
    if total % parts:
        raise ValueError(f"{parts_key}: {parts} does not divide {total_key} {total}")
    return total // parts


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None   # {"rope_type": "linear"|"llama3", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False                # Qwen2
    sliding_window: Optional[int] = None  # Mistral (None = full attention)
    bos_token_id: Optional[int] = None
    eos_token_ids: List[int] = field(default_factory=list)

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise NotImplementedError(
                f"model: architecture {self.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads: {self.num_kv_heads} does not divide "
                             f"num_attention_heads {self.num_heads}")

    @property
    def kv_layout(self) -> Tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim): the KV cache geometry per token."""
        return self.num_layers, self.num_kv_heads, self.head_dim

    def num_params(self) -> int:
        """Parameters touched per token by the matmuls (embedding lookup excluded, LM head included)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp) + self.vocab_size * h

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """From a config.json dict. A missing or bad field is a ValueError naming it."""
        if not isinstance(cfg, dict):
            raise ValueError(f"expected a JSON object (the model's config), got {type(cfg).__name__}")
        model_type = cfg.get("model_type", "llama")
        arch = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}.get(model_type, model_type)
        if cfg.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act: only 'silu' is supported, got {cfg.get('hidden_act')!r}")
        heads = _int_field(cfg, "num_attention_heads")
        hidden = _int_field(cfg, "hidden_size")
        head_dim = _int_field(cfg, "head_dim", None) or _divided(hidden, heads, "hidden_size", "num_attention_heads")
        # transformers >= 5 writes rope_parameters; older versions rope_theta + rope_scaling.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or rope or None
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.get("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        if cfg.get("partial_rotary_factor", 1.0) != 1.0:
            raise NotImplementedError("partial_rotary_factor: only 1.0 is supported")
        sliding = cfg.get("sliding_window")
        if arch == "qwen2" and not cfg.get("use_sliding_window", False):
            sliding = None
        eos = cfg.get("eos_token_id")
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            arch=arch, vocab_size=_int_field(cfg, "vocab_size"), hidden_size=hidden,
            intermediate_size=_int_field(cfg, "intermediate_size"), num_layers=_int_field(cfg, "num_hidden_layers"),
            num_heads=heads, num_kv_heads=_int_field(cfg, "num_key_value_heads", heads), head_dim=head_dim,
            rms_norm_eps=_float_field(cfg, "rms_norm_eps", 1e-6),
            rope_theta=_float_field({"rope_theta": theta}, "rope_theta", 10000.0), rope_scaling=scaling,
            max_position_embeddings=_int_field(cfg, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            sliding_window=sliding, bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos,
        )

    @classmethod
    def from_gguf(cls, meta: dict, has_output_weight: bool, has_qkv_bias: bool) -> "ModelConfig":
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ValueError(f"general.architecture: missing or not a string ({arch!r})")
        p = arch + "."
        heads = _int_field(meta, p + "attention.head_count")
        hidden = _int_field(meta, p + "embedding_length")
        head_dim = _int_field(meta, p + "attention.key_length", None) or _divided(
            hidden, heads, p + "embedding_length", p + "attention.head_count")
        scaling = None
        stype = meta.get(p + "rope.scaling.type")
        if stype == "linear":
            scaling = {"rope_type": "linear", "factor": float(meta[p + "rope.scaling.factor"])}
        elif stype not in (None, "none"):
            raise NotImplementedError(f"model: GGUF rope scaling {stype!r} is not supported")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        vocab = _int_field(meta, p + "vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or [])
        if not vocab:
            raise ValueError(f"{p}vocab_size: missing, and no tokenizer.ggml.tokens to count")
        return cls(
            arch=arch, vocab_size=vocab, hidden_size=hidden,
            intermediate_size=_int_field(meta, p + "feed_forward_length"),
            num_layers=_int_field(meta, p + "block_count"),
            num_heads=heads, num_kv_heads=_int_field(meta, p + "attention.head_count_kv", heads),
            head_dim=head_dim, rms_norm_eps=_float_field(meta, p + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=_float_field(meta, p + "rope.freq_base", 10000.0), rope_scaling=scaling,
            max_position_embeddings=_int_field(meta, p + "context_length", 2048),
            tie_word_embeddings=not has_output_weight, qkv_bias=has_qkv_bias,
            sliding_window=None, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [int(eos)],
        )

    def to_hf(self) -> dict:
        """A transformers config.json dict describing the same model (used to export GGUF weights)."""
        model_type = self.arch
        d = {
            "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM"}[self.arch]],
            "model_type": model_type, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
        }
        if self.arch == "llama":
            d["attention_bias"] = self.qkv_bias
        if self.arch == "mistral":
            d["sliding_window"] = self.sliding_window
        return d
