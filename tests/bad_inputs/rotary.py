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

# ---- corpus of issue 14 ----
_meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
_qq = torch.randn(3, 32)

CASES += [
    # silent garbage: key the same tensor as query (or overlapping it, or the cache)
    ("rope-key-is-query", lambda: f(pos, _qq, _qq, 16, cache, True), ValueError, "key: shares memory with query"),
    ("rope-key-overlaps-query", (lambda b: lambda: f(pos, b[:, :32], b[:, 16:32], 16, cache, True))(torch.randn(3, 48)),
     ValueError, "key: shares memory with query"),
    ("rope-query-is-cache", (lambda c: lambda: f(torch.tensor([0, 1, 2]), c[:3], None, 16, c, True))(torch.randn(8, 16)),
     ValueError, "query: shares memory with cos_sin_cache"),
    # wrong exception types: meta tensors
    ("rope-query-meta", lambda: f(pos, _meta(3, 32), k, 16, cache, True), ValueError, "query: tensors on device 'meta'"),
    ("rope-key-meta", lambda: f(pos, q, _meta(3, 16), 16, cache, True), ValueError, "key: tensors on device 'meta'"),
    ("rope-pos-meta", lambda: f(torch.tensor([0, 1, 2], device="meta"), q, k, 16, cache, True), ValueError,
     "positions: tensors on device 'meta'"),
    ("rope-cache-meta", lambda: f(pos, q, k, 16, _meta(8, 16), True), ValueError, "cos_sin_cache: tensors on device 'meta'"),
    # unclear messages
    ("rope-cache-list", lambda: f(pos, q, k, 16, [[1.0] * 16], True), TypeError, "cos_sin_cache"),
    ("rope-pos-list", lambda: f([0, 1, 2], q, k, 16, cache, True), TypeError, "positions"),
    ("rope-key-list", lambda: f(pos, q, [1.0], 16, cache, True), TypeError, "key"),
    ("rope-head-size-huge", lambda: f(pos, q, k, 2**70, cache, True), ValueError, "head_size"),
    ("rope-head-size-none", lambda: f(pos, q, k, None, cache, True), TypeError, "head_size"),
    ("rope-head-size-float", lambda: f(pos, q, k, 16.0, cache, True), TypeError, "head_size"),
]
