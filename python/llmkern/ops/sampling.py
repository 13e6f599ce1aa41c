"""Sampling ops (FlashInfer signatures) -> csrc/sampling/."""
__all__: list = []
