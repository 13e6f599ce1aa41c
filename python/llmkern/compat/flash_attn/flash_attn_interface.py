"""flash-attn's ``flash_attn.flash_attn_interface`` module: its public functions, on llmkern."""
from ...ops.attention import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
from ...ops.flash_attn_variants import (  # noqa: F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
