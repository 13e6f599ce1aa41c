"""bench/peer_suites.py's machinery on a tiny stand-in for a peer checkout (the real suites need
the peer's source, which CI does not have): device substitution, the module aliases, sampling,
and the pass / fail / out-of-scope classification."""
from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_TEST = '''
import pytest
import torch
from flash_attn import flash_attn_func, flash_attn_varlen_func
from flash_attn.bert_padding import pad_input, unpad_input

@pytest.mark.parametrize("d", [32, 59, 64, 128])
def test_forward(d):
    device = "cuda"
    q, k, v = (torch.randn(2, 5, 2, d, device=device) for _ in range(3))
    out = flash_attn_func(q, k, v, 0.0, None, True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert (out - ref).abs().max().item() < 1e-4

@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
def test_with_backward(dropout_p):
    q = torch.randn(1, 4, 2, 64, device="cuda", requires_grad=True)
    out = flash_attn_func(q, q, q, dropout_p)
    assert out.shape == q.shape
    dq, = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert not dq.isnan().any()

def test_wrong_on_purpose():
    assert torch.cuda.get_device_capability("cuda") == (1, 0)
'''


def _load_runner():
    spec = importlib.util.spec_from_file_location("peer_suites", ROOT / "bench" / "peer_suites.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peer_suites"] = mod
    spec.loader.exec_module(mod)
    return mod


def _fake_checkout(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_flash_attn.py").write_text(textwrap.dedent(FAKE_TEST))
    return tmp_path


def test_runner_classifies_a_fake_flash_attn_suite(tmp_path):
    rep = _load_runner().run("flash-attn", _fake_checkout(tmp_path), "cpu", 0, 0, "", 600.0, [])
    t = rep["totals"]
    assert t["passed"] == 4, rep["failures"] or rep["pytest_tail"]  # every head dim, 59 padded
    assert t["failed"] == 1 and rep["failures"][0]["test"].endswith("test_wrong_on_purpose")
    assert t["out_of_scope"] == 2
    assert rep["out_of_scope_reasons"] == {"dropout": 1, "backward (forward assertions passed)": 1}


def test_runner_samples_and_runs_on_simt(tmp_path):
    import llmkern

    if not llmkern.simt_available():
        pytest.skip("llmkern._simt not built")
    rep = _load_runner().run("flash-attn", _fake_checkout(tmp_path), "simt", 1, 0, "forward", 600.0, [])
    assert rep["totals"]["passed"] == 1, rep["failures"] or rep["pytest_tail"]
    assert rep["by_function"]["test_forward"]["cases"] == 4
