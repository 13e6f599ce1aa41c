import torch

import llmkern

OPS = ["linear_small_m", "pack_linear_weight", "linear_packed", "packed_weight_rows", "pack_gate_up_weight",
       "linear_packed_silu_mul", "pack_linear_weight_bf16", "pack_gate_up_weight_bf16"]
r = llmkern.packed_weight_rows
f = llmkern.linear_small_m
g = llmkern.linear_packed
P = llmkern.pack_linear_weight(torch.randn(20, 8))  # 2 panels, in_features 8
s = llmkern.linear_packed_silu_mul
GU = llmkern.pack_gate_up_weight(torch.randn(20, 8), torch.randn(20, 8))  # 2 pairs of panels

CASES = [
    ("gated-x-rank", lambda: s(torch.randn(8), GU, 20), ValueError, "x"),
    ("gated-k", lambda: s(torch.randn(2, 9), GU, 20), ValueError, "weight_pairs"),
    ("gated-n", lambda: s(torch.randn(2, 8), GU, 40), ValueError, "weight_pairs"),
    ("gated-n-zero", lambda: s(torch.randn(2, 8), GU, 0), ValueError, "out_features"),
    ("gated-unpaired", lambda: s(torch.randn(2, 8), P, 20), ValueError, "weight_pairs"),
    ("gated-half", lambda: s(torch.randn(2, 8).half(), GU, 20), TypeError, "x"),
    ("gated-w-dtype", lambda: s(torch.randn(2, 8), GU.double(), 20), TypeError, "weight_pairs"),
    ("gated-pack-shapes", lambda: llmkern.pack_gate_up_weight(torch.randn(20, 8), torch.randn(20, 9)), ValueError, "up"),
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
    ("pack-rank", lambda: llmkern.pack_linear_weight(torch.randn(8)), ValueError, "weight"),
    ("pack-int", lambda: llmkern.pack_linear_weight(torch.ones(4, 8, dtype=torch.int32)), TypeError, "weight"),
    ("packed-x-rank", lambda: g(torch.randn(8), P, 20), ValueError, "x"),
    ("packed-w-rank", lambda: g(torch.randn(2, 8), torch.randn(20, 8), 20), ValueError, "weight_packed"),
    ("packed-k", lambda: g(torch.randn(2, 9), P, 20), ValueError, "weight_packed"),
    ("packed-n", lambda: g(torch.randn(2, 8), P, 40), ValueError, "weight_packed"),
    ("packed-n-zero", lambda: g(torch.randn(2, 8), P, 0), ValueError, "out_features"),
    ("packed-half", lambda: g(torch.randn(2, 8).half(), P, 20), TypeError, "x"),
    ("packed-w-dtype", lambda: g(torch.randn(2, 8), P.double(), 20), TypeError, "weight_packed"),
    ("packed-bias", lambda: g(torch.randn(2, 8), P, 20, torch.randn(16)), ValueError, "bias"),
    ("packed-bias-dtype", lambda: g(torch.randn(2, 8), P, 20, torch.randn(20).double()), TypeError, "bias"),
    ("packed-noncontig", lambda: g(torch.randn(2, 8), P.transpose(0, 1).contiguous().transpose(0, 1), 20),
     ValueError, "weight_packed"),
    ("packed-not-tensor", lambda: g(torch.randn(2, 8), [1.0], 20), TypeError, "weight_packed"),
    ("rows-range", lambda: r(P, 20, torch.tensor([0, 20])), ValueError, "indices"),
    ("rows-negative", lambda: r(P, 20, torch.tensor([-1])), ValueError, "indices"),
    ("rows-float", lambda: r(P, 20, torch.tensor([1.0])), TypeError, "indices"),
    ("rows-n", lambda: r(P, 40, torch.tensor([1])), ValueError, "weight_packed"),
    ("rows-rank", lambda: r(torch.randn(20, 8), 20, torch.tensor([1])), ValueError, "weight_packed"),
    ("rows-w-dtype", lambda: r(P.double(), 20, torch.tensor([1])), TypeError, "weight_packed"),
]

# ---- corpus of issue 14 ----
_meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731

CASES += [
    # unclear messages: out_features is checked before anything is allocated
    ("packed-n-huge", lambda: g(torch.randn(2, 8), P, 2**40), ValueError, "out_features"),
    ("packed-n-2e70", lambda: g(torch.randn(2, 8), P, 2**70), ValueError, "out_features"),
    ("packed-n-float", lambda: g(torch.randn(2, 8), P, 20.0), TypeError, "out_features"),
    ("packed-n-none", lambda: g(torch.randn(2, 8), P, None), TypeError, "out_features"),
    ("rows-n-huge", lambda: r(P, 2**70, torch.tensor([1])), ValueError, "out_features"),
    ("rows-n-float", lambda: r(P, 20.0, torch.tensor([1])), TypeError, "out_features"),
    ("packed-bias-list", lambda: g(torch.randn(2, 8), P, 20, [0.0] * 20), TypeError, "bias"),
    ("lin-bias-list", lambda: f(torch.randn(2, 8), torch.randn(4, 8), [0.0] * 4), TypeError, "bias"),
    ("lin-w-none", lambda: f(torch.randn(2, 8), None), TypeError, "weight"),
    # wrong exception types: meta tensors
    ("lin-x-meta", lambda: f(_meta(2, 8), torch.randn(4, 8)), ValueError, "x: tensors on device 'meta'"),
    ("lin-w-meta", lambda: f(torch.randn(2, 8), _meta(4, 8)), ValueError, "weight: tensors on device 'meta'"),
    ("packed-x-meta", lambda: g(_meta(2, 8), P, 20), ValueError, "x: tensors on device 'meta'"),
    ("packed-bias-meta", lambda: g(torch.randn(2, 8), P, 20, _meta(20)), ValueError, "bias: tensors on device 'meta'"),
    ("pack-meta", lambda: llmkern.pack_linear_weight(_meta(20, 8)), ValueError, "weight: tensors on device 'meta'"),
    ("rows-idx-meta", lambda: r(P, 20, torch.tensor([1], device="meta")), ValueError, "indices: tensors on device 'meta'"),
]

# ---- bf16 pairs ----
PB = llmkern.pack_linear_weight_bf16(torch.randn(20, 9))  # 2 panels, 5 pairs of in_features 9
GB = llmkern.pack_gate_up_weight_bf16(torch.randn(20, 9), torch.randn(20, 9))
xb = torch.randn(2, 9).bfloat16()
CASES += [
    ("pack-bf16-rank", lambda: llmkern.pack_linear_weight_bf16(torch.randn(9)), ValueError, "weight"),
    ("pack-bf16-int", lambda: llmkern.pack_linear_weight_bf16(torch.ones(4, 8, dtype=torch.int32)), TypeError, "weight"),
    ("pack-bf16-meta", lambda: llmkern.pack_linear_weight_bf16(_meta(20, 8)), ValueError, "weight: tensors on device 'meta'"),
    ("pack-gu-bf16-shapes", lambda: llmkern.pack_gate_up_weight_bf16(torch.randn(20, 9), torch.randn(20, 8)), ValueError, "up"),
    ("pack-gu-bf16-none", lambda: llmkern.pack_gate_up_weight_bf16(None, torch.randn(20, 8)), TypeError, "gate"),
    ("packed-bf16-x-fp32", lambda: g(xb.float(), PB, 20), TypeError, "x"),
    ("packed-bf16-k", lambda: g(torch.randn(2, 11).bfloat16(), PB, 20), ValueError, "weight_packed"),
    ("packed-bf16-bias-dtype", lambda: g(xb, PB, 20, torch.randn(20)), TypeError, "bias"),
    ("packed-bf16-half-w", lambda: g(xb, PB.half(), 20), TypeError, "weight_packed"),
    ("gated-bf16-unpaired", lambda: s(xb, PB, 20), ValueError, "weight_pairs"),
    ("gated-bf16-x-half", lambda: s(xb.half(), GB, 20), TypeError, "x"),
    ("rows-bf16-no-k", lambda: r(PB, 20, torch.tensor([1])), ValueError, "in_features"),
    ("rows-bf16-k", lambda: r(PB, 20, torch.tensor([1]), 12), ValueError, "weight_packed"),
]
