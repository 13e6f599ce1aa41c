import torch

import llmkern as lk

OPS = ["apply_token_bitmask_inplace"]

_L = lambda: torch.randn(3, 100)  # noqa: E731
_M = lambda: torch.full((3, 4), -1, dtype=torch.int32)  # noqa: E731
apply = lk.apply_token_bitmask_inplace

CASES = [
    ("bitmask-int64", lambda: apply(_L(), _M().long()), TypeError, "bitmask"),
    ("bitmask-rows", lambda: apply(_L(), _M()[:2]), ValueError, "bitmask"),
    ("bitmask-rank", lambda: apply(_L(), _M()[None]), ValueError, "bitmask"),
    ("bitmask-too-few-words", lambda: apply(_L(), _M()[:, :3], vocab_size=97), ValueError, "bitmask"),
    ("bitmask-not-tensor", lambda: apply(_L(), [[-1] * 4] * 3), TypeError, "bitmask"),
    ("bitmask-vocab-size", lambda: apply(_L(), _M(), vocab_size=101), ValueError, "vocab_size"),
    ("bitmask-indices-range", lambda: apply(_L(), _M(), indices=[3]), ValueError, "indices"),
    ("bitmask-int-logits", lambda: apply(torch.zeros(3, 100, dtype=torch.long), _M()), TypeError, "logits"),
    ("sampler-mask-dtype", lambda: lk.sampling_from_logits(_L(), token_bitmask=_M().float()), TypeError,
     "token_bitmask"),
    ("sampler-mask-words", lambda: lk.top_k_top_p_sampling_from_probs(torch.softmax(_L(), -1), 5, 0.9,
                                                                     token_bitmask=_M()[:, :3]), ValueError,
     "token_bitmask"),
    ("softmax-mask-rows", lambda: lk.softmax(_L(), token_bitmask=_M()[:1]), ValueError, "token_bitmask"),
]
