"""Model building blocks over llmkern's kernels: paged attention (with its explicit AttnMetadata),
RMSNorm, rotary embedding, linear projections, the gated SiLU, token embedding and LM head, and the
mixture-of-experts MLP.
Models compose them; nothing here knows about the engine."""
from .activation import silu_and_mul
from .attention import AttnMetadata, paged_attention
from .embed_head import compute_logits, embed_tokens
from .layernorm import RMSNorm
from .linear import Linear
from .moe import MoE, SharedExpert
from .rotary import RotaryEmbedding, cos_sin_cache

__all__ = ["AttnMetadata", "paged_attention", "RMSNorm", "RotaryEmbedding", "cos_sin_cache", "Linear", "MoE", "SharedExpert",
           "silu_and_mul", "embed_tokens", "compute_logits"]
