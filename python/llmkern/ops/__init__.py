"""Kernel ops, one module per family: attention.py (+ flash_attn_variants.py), kvcache.py,
sampling.py (the import path of samplers.py, sampling_filters.py, speculative.py, penalties.py),
linear.py (+ linear_gguf.py, gguf_blocks.py: GGUF-quantised weights), layernorm.py, rotary.py."""
from . import attention, flash_attn_variants, kvcache, layernorm, linear, linear_gguf, moe, rotary, sampling
from .attention import *  # noqa: F401,F403
from .flash_attn_variants import *  # noqa: F401,F403
from .kvcache import *  # noqa: F401,F403
from .layernorm import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .linear_gguf import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .rotary import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403

__all__ = [*attention.__all__, *flash_attn_variants.__all__, *kvcache.__all__, *layernorm.__all__, *linear.__all__, *linear_gguf.__all__, *moe.__all__, *rotary.__all__,
           *sampling.__all__]
