"""The runtime: LLM (offline API), Engine (step loop), Scheduler, KV-cache manager, model runner."""
from __future__ import annotations

_EXPORTS = {
    "LLM": "llm", "SamplingParams": "sampling_params", "Engine": "engine", "EngineConfig": "config",
    "RequestOutput": "outputs", "CompletionOutput": "outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name):  # imported lazily so that models/ can import engine.kernels without cycles
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
