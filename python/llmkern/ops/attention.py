"""Attention ops (flash-attn 2 signatures) -> csrc/attention/."""
__all__: list = []
