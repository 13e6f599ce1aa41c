"""The model the peers load: the embedded GGUF's weights (dequantised to fp32, exactly what
llmkern's loader gives llmkern) written once as a HF directory into a cache outside the
repository, so every engine in the comparison computes with the same numbers."""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional


def cache_root() -> str:
    """LLMKERN_PEER_CACHE, else $XDG_CACHE_HOME/llmkern/peers (default ~/.cache/llmkern/peers)."""
    if os.environ.get("LLMKERN_PEER_CACHE"):
        return os.environ["LLMKERN_PEER_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmkern", "peers")


def model_cache_dir(gguf_path: Optional[str] = None) -> str:
    """Folder of one source model's exports (HF dir, converted peer formats), keyed by the file's
    name, size and mtime so a changed model is exported again."""
    from ...models.loader import default_model_path

    src = gguf_path or default_model_path()
    st = os.stat(src)
    stem = os.path.splitext(os.path.basename(src))[0]
    return os.path.join(cache_root(), f"{stem}-{st.st_size}-{int(st.st_mtime)}")


def hf_model_dir(gguf_path: Optional[str] = None) -> str:
    """A HF model directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
    of the GGUF at gguf_path (default: the embedded model); written on first use."""
    from ...models.loader import default_model_path, read_gguf, save_hf_dir

    src = gguf_path or default_model_path()
    out = os.path.join(model_cache_dir(src), "hf")
    if os.path.exists(os.path.join(out, "tokenizer_config.json")):  # written last
        return out
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cfg, sd, tok = read_gguf(src)
    save_hf_dir(cfg, sd, tmp)
    if tok is not None:  # the converters (CTranslate2) read the vocabulary through transformers
        tok.tok.save(os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "model_max_length": cfg.max_position_embeddings,
                   **{k: v for k, v in (tok.special_tokens if tok else {}).items()
                      if k in ("bos_token", "eos_token")}}, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
