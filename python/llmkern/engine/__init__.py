"""The runtime: LLM (offline API), Engine (step loop), Scheduler, KV-cache manager, model runner.

The names below are imported on first use, so that a light submodule (engine.args, the CLI's
option groups) loads without the model stack."""
import importlib

_EXPORTS = {"EngineConfig": ".config", "Engine": ".engine", "LLM": ".llm", "CompletionOutput": ".outputs",
            "RequestOutput": ".outputs", "SamplingParams": ".sampling_params"}

__all__ = ["LLM", "SamplingParams", "Engine", "EngineConfig", "RequestOutput", "CompletionOutput"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
