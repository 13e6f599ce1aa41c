import torch

import llmkern

OPS = ["linear_small_m"]
f = llmkern.linear_small_m

CASES = [
    ("lin-x-rank", lambda: f(torch.randn(2, 3, 8), torch.randn(4, 8)), ValueError, "x"),
    ("lin-w-rank", lambda: f(torch.randn(2, 8), torch.randn(8)), ValueError, "weight"),
    ("lin-k", lambda: f(torch.randn(2, 8), torch.randn(4, 7)), ValueError, "weight"),
    ("lin-dtype", lambda: f(torch.randn(2, 8), torch.randn(4, 8).half()), TypeError, "weight"),
    ("lin-int", lambda: f(torch.ones(2, 8, dtype=torch.int32), torch.ones(4, 8, dtype=torch.int32)), TypeError, "x"),
    ("lin-rows", lambda: f(torch.randn(17, 8), torch.randn(4, 8)), ValueError, "x"),
    ("lin-bias", lambda: f(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5)), ValueError, "bias"),
    ("lin-bias-dtype", lambda: f(torch.randn(2, 8), torch.randn(4, 8), torch.randn(4).double()), TypeError, "bias"),
    ("lin-noncontig-w", lambda: f(torch.randn(2, 8), torch.randn(8, 4).t()), ValueError, "weight"),
    ("lin-not-tensor", lambda: f([1.0], torch.randn(4, 8)), TypeError, "x"),
]
