"""Kernel ops, one module per family: attention.py, kvcache.py, sampling.py, linear.py."""
from . import attention, kvcache, linear, sampling
from .attention import *  # noqa: F401,F403
from .kvcache import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403

__all__ = [*attention.__all__, *kvcache.__all__, *linear.__all__, *sampling.__all__]
