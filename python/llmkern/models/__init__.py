"""Models served by the runtime: the Llama family over a paged KV cache, and their loaders."""
from .config import ModelConfig
from .llama import LlamaForCausalLM
from .loader import default_model_path, load_model
from .tokenizer import Tokenizer

__all__ = ["ModelConfig", "LlamaForCausalLM", "Tokenizer", "load_model", "default_model_path"]
