import torch

import llmkern

OPS = ["rotary_embedding"]
f = llmkern.rotary_embedding
pos, q, k = torch.tensor([0, 1, 2]), torch.randn(3, 32), torch.randn(3, 16)
cache = torch.randn(8, 16)

CASES = [
    ("rope-pos-dtype", lambda: f(pos.float(), q, k, 16, cache, True), TypeError, "positions"),
    ("rope-pos-range", lambda: f(torch.tensor([0, 8, 1]), q, k, 16, cache, True), ValueError, "positions"),
    ("rope-pos-negative", lambda: f(torch.tensor([0, -1, 1]), q, k, 16, cache, True), ValueError, "positions"),
    ("rope-pos-count", lambda: f(torch.tensor([0, 1]), q, k, 16, cache, True), ValueError, "query"),
    ("rope-head-size", lambda: f(pos, q, k, 12, cache, True), ValueError, "cos_sin_cache"),
    ("rope-head-multiple", lambda: f(pos, torch.randn(3, 40), k, 16, cache, True), ValueError, "query"),
    ("rope-head-size-zero", lambda: f(pos, q, k, 0, cache, True), ValueError, "head_size"),
    ("rope-odd-rot", lambda: f(pos, q, k, 16, torch.randn(8, 15), True), ValueError, "cos_sin_cache"),
    ("rope-cache-dtype", lambda: f(pos, q, k, 16, cache.half(), True), TypeError, "query"),
    ("rope-key-dtype", lambda: f(pos, q, k.double(), 16, cache, True), TypeError, "key"),
    ("rope-noncontig", lambda: f(pos, torch.randn(32, 3).t(), k, 16, cache, True), ValueError, "query"),
    ("rope-heads-split", lambda: f(pos, torch.randn(3, 16, 2).transpose(1, 2), k, 16, cache, True),
     ValueError, "query"),
    ("rope-not-tensor", lambda: f(pos, [1.0], k, 16, cache, True), TypeError, "query"),
]
