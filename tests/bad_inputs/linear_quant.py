import functools

import torch

import llmkern

OPS = ["pack_quant_weight", "pack_quant_gate_up", "linear_quant", "linear_quant_silu_mul", "quant_weight_rows"]
RAW = torch.zeros(20, 2 * 18, dtype=torch.uint8)  # Q4_0 [20, 64]: two blocks of 18 bytes per row
LAYOUT = 0  # 4-bit, block 32


@functools.lru_cache(maxsize=None)
def _packed(gated: bool = False) -> torch.Tensor:  # at first use: packing needs numpy (collection does not)
    if gated:
        return llmkern.pack_quant_gate_up(RAW, RAW, "Q4_0", 20, 64)[0]
    return llmkern.pack_quant_weight(RAW, "Q4_0", 20, 64)[0]


def f(x, w, *a):
    return llmkern.linear_quant(x, _packed() if w is None else w, *a)


def s(x, w, *a):
    return llmkern.linear_quant_silu_mul(x, _packed(w == "gu") if isinstance(w, str) else w, *a)


def r(w, *a):
    return llmkern.quant_weight_rows(_packed() if w is None else w, *a)


W, GU = None, "gu"
x = torch.randn(2, 64)

CASES = [
    ("pack-qtype", lambda: llmkern.pack_quant_weight(RAW, "Q3_K", 20, 64), ValueError, "qtype"),
    ("pack-qtype-id", lambda: llmkern.pack_quant_weight(RAW, 0, 20, 64), ValueError, "qtype"),
    ("pack-bytes", lambda: llmkern.pack_quant_weight(RAW[:, :20], "Q4_0", 20, 64), ValueError, "weight"),
    ("pack-k", lambda: llmkern.pack_quant_weight(RAW, "Q4_K", 20, 64), ValueError, "in_features"),
    ("pack-n", lambda: llmkern.pack_quant_weight(RAW, "Q4_0", 0, 64), ValueError, "out_features"),
    ("pack-n-type", lambda: llmkern.pack_quant_weight(RAW, "Q4_0", 2.5, 64), TypeError, "out_features"),
    ("gu-up-layout", lambda: llmkern.pack_quant_gate_up(RAW, torch.zeros(20, 2 * 34, dtype=torch.uint8), "Q4_0", 20,
                                                        64, up_qtype="Q8_0"), ValueError, "up"),
    ("lin-layout", lambda: f(x, W, 20, 3), ValueError, "layout"),
    ("lin-x-rank", lambda: f(torch.randn(64), W, 20, LAYOUT), ValueError, "x"),
    ("lin-x-half", lambda: f(x.half(), W, 20, LAYOUT), TypeError, "x"),
    ("lin-k", lambda: f(torch.randn(2, 96), W, 20, LAYOUT), ValueError, "weight_q"),
    ("lin-k-32", lambda: f(torch.randn(2, 48), W, 20, LAYOUT), ValueError, "in_features"),
    ("lin-n", lambda: f(x, W, 40, LAYOUT), ValueError, "weight_q"),
    ("lin-n-zero", lambda: f(x, W, 0, LAYOUT), ValueError, "out_features"),
    ("lin-w-dtype", lambda: f(x, _packed().float(), 20, LAYOUT), TypeError, "weight_q"),
    ("lin-bias", lambda: f(x, W, 20, LAYOUT, torch.randn(19)), ValueError, "bias"),
    ("lin-bias-dtype", lambda: f(x, W, 20, LAYOUT, torch.randn(20).double()), TypeError, "bias"),
    ("lin-not-tensor", lambda: f([1.0], W, 20, LAYOUT), TypeError, "x"),
    ("gated-unpaired", lambda: s(x, "w", 20, LAYOUT), ValueError, "weight_q"),
    ("gated-n", lambda: s(x, GU, 40, LAYOUT), ValueError, "weight_q"),
    ("rows-range", lambda: r(W, 20, LAYOUT, torch.tensor([20]), 64), ValueError, "indices"),
    ("rows-negative", lambda: r(W, 20, LAYOUT, torch.tensor([-1]), 64), ValueError, "indices"),
    ("rows-float-ids", lambda: r(W, 20, LAYOUT, torch.tensor([1.0]), 64), TypeError, "indices"),
    ("rows-dtype", lambda: r(W, 20, LAYOUT, torch.tensor([1]), 64, torch.float16), TypeError, "out"),
    ("rows-k", lambda: r(W, 20, LAYOUT, torch.tensor([1]), 96), ValueError, "weight_q"),
]
