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

# ---- corpus of issue 14 ----
_meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731


def _partial():
    buf = torch.randn(4, 8)
    return lambda: rn(buf[1:], buf[:3], w, 1e-5)


def _out_is_weight_row():
    buf = torch.randn(4, 8)
    return lambda: rn(buf[:3], x, buf[2], 1e-5)


def _silu_out_in_input():
    inp = torch.randn(3, 8)
    return lambda: sm(inp[:, :4], inp)


CASES += [
    # silent garbage: partial overlaps (out == input exactly is the documented in-place form)
    ("rn-out-partial-overlap", _partial(), ValueError, "out: shares memory with input"),
    ("rn-out-overlaps-weight", _out_is_weight_row(), ValueError, "out: shares memory with weight"),
    ("fa-residual-is-input", (lambda t: lambda: fa(t, t, w, 1e-5))(torch.randn(3, 8)), ValueError,
     "residual: shares memory with input"),
    ("sm-out-in-input", _silu_out_in_input(), ValueError, "out: shares memory with input"),
    # wrong exception types: meta tensors
    ("rn-input-meta", lambda: rn(torch.empty(3, 8), _meta(3, 8), w, 1e-5), ValueError, "input: tensors on device 'meta'"),
    ("rn-weight-meta", lambda: rn(torch.empty(3, 8), x, _meta(8), 1e-5), ValueError, "weight: tensors on device 'meta'"),
    ("fa-residual-meta", lambda: fa(x.clone(), _meta(3, 8), w, 1e-5), ValueError, "residual: tensors on device 'meta'"),
    ("sm-out-meta", lambda: sm(_meta(3, 4), torch.randn(3, 8)), ValueError, "out: tensors on device 'meta'"),
    # unclear messages
    ("rn-weight-list", lambda: rn(torch.empty(3, 8), x, [1.0] * 8, 1e-5), TypeError, "weight"),
    ("rn-weight-none", lambda: rn(torch.empty(3, 8), x, None, 1e-5), TypeError, "weight"),
    ("rn-eps-str", lambda: rn(torch.empty(3, 8), x, w, "x"), TypeError, "epsilon"),
    ("rn-eps-none", lambda: rn(torch.empty(3, 8), x, w, None), TypeError, "epsilon"),
    ("fa-weight-list", lambda: fa(x.clone(), x.clone(), [1.0] * 8, 1e-5), TypeError, "weight"),
    ("fa-eps-str", lambda: fa(x.clone(), x.clone(), w, "x"), TypeError, "epsilon"),
    ("sm-out-none", lambda: sm(None, torch.randn(3, 8)), TypeError, "out"),
]
