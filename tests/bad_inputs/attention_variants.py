import torch

import llmkern

OPS = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
       "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]

_CU = lambda: torch.tensor([0, 3, 5], dtype=torch.int32)  # noqa: E731
_Q = lambda: torch.randn(2, 3, 4, 16)  # noqa: E731

CASES = [
    ("fa-q-3d", lambda: llmkern.flash_attn_func(torch.randn(3, 4, 16), _Q(), _Q()), ValueError, "q"),
    ("fa-batch", lambda: llmkern.flash_attn_func(_Q(), torch.randn(1, 3, 4, 16), torch.randn(1, 3, 4, 16)), ValueError, "k"),
    ("fa-dropout", lambda: llmkern.flash_attn_func(_Q(), _Q(), _Q(), 0.5), NotImplementedError, "dropout_p"),
    ("fa-not-tensor", lambda: llmkern.flash_attn_func(_Q(), None, _Q()), TypeError, "k"),
    ("fa-kvpacked-shape", lambda: llmkern.flash_attn_kvpacked_func(_Q(), torch.randn(2, 3, 3, 4, 16)), ValueError, "kv"),
    ("fa-qkvpacked-shape", lambda: llmkern.flash_attn_qkvpacked_func(torch.randn(2, 3, 2, 4, 16)), ValueError, "qkv"),
    ("fa-varlen-qkvpacked-shape", lambda: llmkern.flash_attn_varlen_qkvpacked_func(torch.randn(5, 4, 16), _CU(), 3),
     ValueError, "qkv"),
    ("fa-varlen-kvpacked-shape", lambda: llmkern.flash_attn_varlen_kvpacked_func(
        torch.randn(5, 4, 16), torch.randn(5, 4, 16), _CU(), _CU(), 3, 3), ValueError, "kv"),
    ("fa-varlen-kvpacked-dropout", lambda: llmkern.flash_attn_varlen_kvpacked_func(
        torch.randn(5, 4, 16), torch.randn(5, 2, 2, 16), _CU(), _CU(), 3, 3, 0.2), NotImplementedError, "dropout_p"),
]
