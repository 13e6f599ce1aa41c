"""flash-attn's ``flash_attn.layers`` modules that inference code imports (``rotary``)."""
