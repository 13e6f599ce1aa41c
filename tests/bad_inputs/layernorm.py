import torch

import llmkern

OPS = ["rms_norm", "fused_add_rms_norm", "silu_and_mul"]
rn, fa, sm = llmkern.rms_norm, llmkern.fused_add_rms_norm, llmkern.silu_and_mul
x, w = torch.randn(3, 8), torch.randn(8)

CASES = [
    ("rn-out-shape", lambda: rn(torch.empty(3, 7), x, w, 1e-5), ValueError, "out"),
    ("rn-out-rows", lambda: rn(torch.empty(2, 8), x, w, 1e-5), ValueError, "out"),
    ("rn-weight", lambda: rn(torch.empty(3, 8), x, torch.randn(7), 1e-5), ValueError, "weight"),
    ("rn-weight-dtype", lambda: rn(torch.empty(3, 8), x, w.half(), 1e-5), TypeError, "weight"),
    ("rn-int", lambda: rn(torch.empty(3, 8, dtype=torch.int32), torch.ones(3, 8, dtype=torch.int32),
                          torch.ones(8, dtype=torch.int32), 1e-5), TypeError, "input"),
    ("rn-eps", lambda: rn(torch.empty(3, 8), x, w, -1.0), ValueError, "epsilon"),
    ("rn-noncontig", lambda: rn(torch.empty(3, 8), torch.randn(8, 3).t(), w, 1e-5), ValueError, "input"),
    ("rn-not-tensor", lambda: rn(torch.empty(3, 8), [1.0], w, 1e-5), TypeError, "input"),
    ("rn-scalar", lambda: rn(torch.empty(3, 8), torch.tensor(1.0), w, 1e-5), ValueError, "input"),
    ("fa-residual-shape", lambda: fa(x.clone(), torch.randn(3, 9), w, 1e-5), ValueError, "residual"),
    ("fa-residual-dtype", lambda: fa(x.clone(), torch.randn(3, 8).double(), w, 1e-5), TypeError, "residual"),
    ("fa-view-copy", lambda: fa(torch.randn(2, 8, 3).transpose(1, 2), torch.randn(2, 3, 8), w, 1e-5),
     ValueError, "input"),
    ("sm-odd", lambda: sm(torch.empty(3, 3), torch.randn(3, 7)), ValueError, "input"),
    ("sm-out", lambda: sm(torch.empty(3, 5), torch.randn(3, 8)), ValueError, "out"),
    ("sm-out-dtype", lambda: sm(torch.empty(3, 4).half(), torch.randn(3, 8)), TypeError, "out"),
]
