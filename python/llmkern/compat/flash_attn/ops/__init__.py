"""flash-attn's ``flash_attn.ops`` modules that inference code imports: ``rms_norm`` and
``triton.layer_norm``'s RMS norm (forward only)."""
