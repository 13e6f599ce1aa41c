"""ModelConfig: the architecture facts the runtime needs, read from a HF config.json dict or from
GGUF metadata, for the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM) and its mixture-of-experts
relatives (Mixtral, Qwen2-MoE, Qwen3-MoE)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe")
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
# llama.cpp's architecture names; a "llama" GGUF with experts is a Mixtral
_GGUF_ARCHS = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
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
    # mixture of experts (0 experts: a dense model)
    num_experts: int = 0                  # routed experts of a sparse layer
    num_experts_per_tok: int = 0          # top-k
    moe_intermediate_size: int = 0        # of one routed expert
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert, sigmoid-gated (0: none)
    norm_topk_prob: bool = False          # renormalise the top-k weights to sum 1 (Mixtral: always)
    decoder_sparse_step: int = 1          # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: List[int] = field(default_factory=list)  # ... and i is not listed here
    qk_norm: bool = False                 # Qwen3: RMSNorm over each query/key head before RoPE
    # a model-parallel shard's run of experts under expert parallelism: (first, count); None: all
    local_experts: Optional[Tuple[int, int]] = None

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise NotImplementedError(
                f"model: architecture {self.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads: {self.num_kv_heads} does not divide "
                             f"num_attention_heads {self.num_heads}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok: expected 1..{self.num_experts} (num_experts), "
                             f"got {self.num_experts_per_tok}")

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer i (of the whole model) has routed experts instead of a dense MLP."""
        return (self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0
                and i not in self.mlp_only_layers)

    @property
    def kv_layout(self) -> Tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim): the KV cache geometry per token."""
        return self.num_layers, self.num_kv_heads, self.head_dim

    def num_params(self) -> int:
        """Parameters touched per token by the matmuls (embedding lookup excluded, LM head included)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        dense = 3 * h * self.intermediate_size
        sparse = (3 * h * (self.num_experts_per_tok * self.moe_intermediate_size + self.shared_expert_intermediate_size)
                  + h * self.num_experts)  # the k experts a token visits, the shared one, the router
        n_sparse = sum(self.is_moe_layer(i) for i in range(self.num_layers))
        return self.num_layers * attn + n_sparse * sparse + (self.num_layers - n_sparse) * dense + self.vocab_size * h

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """From a config.json dict. A missing or bad field is a ValueError naming it."""
        if not isinstance(cfg, dict):
            raise ValueError(f"expected a JSON object (the model's config), got {type(cfg).__name__}")
        model_type = cfg.get("model_type", "llama")
        arch = model_type
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
        if arch in ("qwen2", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window", False):
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
            qkv_bias=bool(cfg.get("qkv_bias", cfg.get("attention_bias", arch in ("qwen2", "qwen2_moe")))),
            sliding_window=sliding, bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos,
            **(_moe_from_hf(cfg, arch) if arch in MOE_ARCHS else {}),
        )

    @classmethod
    def from_gguf(cls, meta: dict, has_output_weight: bool, has_qkv_bias: bool) -> "ModelConfig":
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ValueError(f"general.architecture: missing or not a string ({arch!r})")
        p = arch + "."
        moe = {}
        if meta.get(p + "expert_count"):
            arch = _GGUF_ARCHS.get(arch, "mixtral" if arch == "llama" else arch)
            moe = _moe_from_gguf(meta, p, arch)
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
            eos_token_ids=[] if eos is None else [int(eos)], **moe,
        )

    def to_hf(self) -> dict:
        """A transformers config.json dict describing the same model (used to export GGUF weights)."""
        model_type = self.arch
        d = {
            "architectures": [_HF_CLASSES[self.arch]],
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
        if self.arch in ("qwen2_moe", "qwen3_moe"):
            d.update(num_experts=self.num_experts, moe_intermediate_size=self.moe_intermediate_size,
                     shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                     norm_topk_prob=self.norm_topk_prob, decoder_sparse_step=self.decoder_sparse_step,
                     mlp_only_layers=list(self.mlp_only_layers), qkv_bias=self.qkv_bias,
                     attention_bias=self.qkv_bias)
        if self.arch == "mixtral":
            d["num_local_experts"] = self.num_experts
        if self.num_experts:
            d["num_experts_per_tok"] = self.num_experts_per_tok
        return d


def _moe_from_hf(cfg: dict, arch: str) -> dict:
    """The expert fields of a Mixtral / Qwen2-MoE / Qwen3-MoE config.json."""
    n = _int_field(cfg, "num_local_experts" if arch == "mixtral" else "num_experts", None) \
        or _int_field(cfg, "num_local_experts", None) or _int_field(cfg, "num_experts")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, (list, tuple)) or not all(isinstance(i, int) for i in only):
        raise ValueError(f"mlp_only_layers: expected a list of layer indices, got {only!r}")
    return dict(
        num_experts=n, num_experts_per_tok=_int_field(cfg, "num_experts_per_tok"),
        moe_intermediate_size=_int_field(cfg, "intermediate_size" if arch == "mixtral" else "moe_intermediate_size"),
        shared_expert_intermediate_size=(_int_field(cfg, "shared_expert_intermediate_size", 0)
                                         if arch == "qwen2_moe" and cfg.get("shared_expert_intermediate_size") else 0),
        norm_topk_prob=True if arch == "mixtral" else bool(cfg.get("norm_topk_prob", False)),
        decoder_sparse_step=_int_field(cfg, "decoder_sparse_step", 1), mlp_only_layers=list(only),
        qk_norm=arch == "qwen3_moe")


def _moe_from_gguf(meta: dict, p: str, arch: str) -> dict:
    """The expert fields of a GGUF (llama.cpp writes every layer sparse). llama.cpp renormalises the
    top-k weights of Mixtral and Qwen3-MoE and not those of Qwen2-MoE unless expert_weights_norm says."""
    norm = meta.get(p + "expert_weights_norm")
    return dict(
        num_experts=_int_field(meta, p + "expert_count"), num_experts_per_tok=_int_field(meta, p + "expert_used_count"),
        moe_intermediate_size=_int_field(meta, p + "expert_feed_forward_length", None)
        or _int_field(meta, p + "feed_forward_length"),
        shared_expert_intermediate_size=_int_field(meta, p + "expert_shared_feed_forward_length", 0)
        if meta.get(p + "expert_shared_feed_forward_length") else 0,
        norm_topk_prob=bool(norm) if norm is not None else arch != "qwen2_moe", qk_norm=arch == "qwen3_moe")
