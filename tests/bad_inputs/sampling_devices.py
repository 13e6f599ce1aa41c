"""Meta tensors given to the sampling ops (the shared argument check in llmkern/_args.py): a
ValueError naming the argument and the device, never DLPack's BufferError."""
import torch

import llmkern as lk

OPS: list = []  # coverage of these ops is claimed by bad_inputs/sampling.py

_M = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
_P = lambda: torch.softmax(torch.randn(3, 50), -1)  # noqa: E731
_MSG = "tensors on device 'meta'"

CASES = [
    ("probs-meta", lambda: lk.sampling_from_probs(_M(3, 50)), ValueError, f"probs: {_MSG}"),
    ("logits-meta", lambda: lk.sampling_from_logits(_M(3, 50)), ValueError, f"logits: {_MSG}"),
    ("top-k-probs-meta", lambda: lk.top_k_sampling_from_probs(_M(3, 50), 5), ValueError, f"probs: {_MSG}"),
    ("top-p-probs-meta", lambda: lk.top_p_sampling_from_probs(_M(3, 50), 0.9), ValueError, f"probs: {_MSG}"),
    ("min-p-probs-meta", lambda: lk.min_p_sampling_from_probs(_M(3, 50), 0.1), ValueError, f"probs: {_MSG}"),
    ("top-k-top-p-logits-meta", lambda: lk.top_k_top_p_sampling_from_logits(_M(3, 50), 5, 0.9), ValueError,
     f"logits: {_MSG}"),
    ("top-k-top-p-probs-meta", lambda: lk.top_k_top_p_sampling_from_probs(_M(3, 50), 5, 0.9), ValueError,
     f"probs: {_MSG}"),
    ("indices-meta", lambda: lk.sampling_from_probs(_P(), indices=torch.zeros(3, dtype=torch.int32, device="meta")),
     ValueError, f"indices: {_MSG}"),
    ("mask-meta", lambda: lk.top_k_mask_logits(_M(3, 50), 5), ValueError, f"logits: {_MSG}"),
    ("renorm-p-meta", lambda: lk.top_p_renorm_probs(_M(3, 50), 0.9), ValueError, f"probs: {_MSG}"),
    ("renorm-k-meta", lambda: lk.top_k_renorm_probs(_M(3, 50), 5), ValueError, f"probs: {_MSG}"),
    ("spec-target-meta", lambda: lk.chain_speculative_sampling(
        torch.softmax(torch.randn(2, 2, 50), -1), torch.randint(0, 50, (2, 2)), _M(2, 3, 50)),
     ValueError, f"target_probs: {_MSG}"),
]
