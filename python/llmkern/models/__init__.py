"""Models served by the runtime: the Llama family over a paged KV cache, and their loaders."""
from __future__ import annotations

# Exported lazily: a submodule imports without the loader's and the tokenizer's dependencies
# (numpy, tokenizers), which a kernels-only install may lack.
_EXPORTS = {
    "ModelConfig": "config", "LlamaForCausalLM": "llama", "Tokenizer": "tokenizer",
    "load_model": "loader", "default_model_path": "loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
