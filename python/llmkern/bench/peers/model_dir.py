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


# what gguf-py's quantiser writes, beside F32 and BF16
QUANTISED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def write_gguf(src: str, dst: str, dtype: str = "float32") -> None:
    """The GGUF at src with every tensor dequantised, then stored as F32 (dtype "float32"), or with
    the matrices as BF16 ("bfloat16", llama.cpp's own BF16 layout) or requantised by gguf-py to one
    of QUANTISED_TYPES, the 1-D tensors (norms) as F32; metadata copied as is."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize

    if dtype not in ("float32", "bfloat16") + QUANTISED_TYPES:
        raise ValueError(f"dtype: expected float32, bfloat16 or one of {', '.join(QUANTISED_TYPES)}, got {dtype!r}")
    mtype = gguf.GGMLQuantizationType.BF16 if dtype == "bfloat16" else getattr(gguf.GGMLQuantizationType, dtype, None)
    ftype = {"float32": gguf.LlamaFileType.ALL_F32, "bfloat16": gguf.LlamaFileType.MOSTLY_BF16}.get(dtype)
    if ftype is None:  # (ALL_F32 is 0: no `or` here)
        ftype = gguf.LlamaFileType[f"MOSTLY_{dtype}"]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            w.add_file_type(ftype)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else arr.reshape(-1)
        if mtype is not None and arr.ndim > 1:
            w.add_tensor(t.name, quantize(arr, mtype), raw_dtype=mtype)
        else:
            w.add_tensor(t.name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_model_file(dtype: str, gguf_path: Optional[str] = None) -> str:
    """The embedded model (or gguf_path) as an F32 or BF16 GGUF in the cache, written on first use;
    dtype "gguf": the file itself, as stored (quantised)."""
    from ...models.loader import default_model_path

    src = gguf_path or default_model_path()
    if dtype == "gguf":
        return src
    out = os.path.join(model_cache_dir(src), f"model-{dtype}.gguf")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_gguf(src, out + ".partial", dtype)
        os.replace(out + ".partial", out)
    return out
