"""flash-attn's ``flash_attn.ops.triton`` package (only ``layer_norm``'s RMS norm here)."""
