"""The runtime: LLM (offline API), Engine (step loop), Scheduler, KV-cache manager, model runner."""
from .config import EngineConfig
from .engine import Engine
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "Engine", "EngineConfig", "RequestOutput", "CompletionOutput"]
