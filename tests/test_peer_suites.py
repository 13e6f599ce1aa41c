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


FAKE_FLASHINFER_DECODE = '''
import pytest
import torch
import flashinfer
from tests.test_helpers.jit_utils import gen_decode_attention_modules
from tests.test_helpers.parametrize import pairwise_product_cases, parametrize_product


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float8_e4m3fn])
@parametrize_product({"kv_len": [54, 16384], "page_size": [1, 16], "kv_layout": ["NHD", "HND"],
                      "pos_encoding_mode": ["NONE", "ROPE_LLAMA"]}, regular=pairwise_product_cases)
def test_batch_decode(kv_len, page_size, kv_layout, pos_encoding_mode, kv_dtype):
    assert kv_len in (54, 1024)  # the runner shrinks 16k contexts
    batch, hq, hkv, d = 3, 8, 2, 64
    pages = (kv_len + page_size - 1) // page_size
    shape = [pages * batch, 2, page_size, hkv, d] if kv_layout == "NHD" else [pages * batch, 2, hkv, page_size, d]
    kv = torch.randn(*shape, device="cuda:0").to(kv_dtype)
    q = torch.randn(batch, hq, d, device="cuda:0").half()
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda:0") * pages
    indices = torch.arange(pages * batch, dtype=torch.int32, device="cuda:0")
    last = torch.full((batch,), (kv_len - 1) % page_size + 1, dtype=torch.int32, device="cuda:0")
    w = flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.int8, device="cuda:0"), kv_layout)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, pos_encoding_mode=pos_encoding_mode, data_type=kv_dtype)
    o, lse = w.run(q, kv, return_lse=True)
    for i in range(batch):
        blk = kv[i * pages:(i + 1) * pages]
        if kv_layout == "HND":
            blk = blk.transpose(2, 3)
        ki, vi = (blk[:, j].reshape(-1, hkv, d)[:kv_len] for j in (0, 1))
        ref = flashinfer.single_decode_with_kv_cache(q[i], ki, vi, pos_encoding_mode=pos_encoding_mode)
        torch.testing.assert_close(o[i], ref, rtol=1e-3, atol=1e-3)
'''

FAKE_FLASHINFER_SAMPLING = '''
import pytest

@pytest.mark.parametrize("vocab_size", [111, 32000, 128256])
def test_sizes_are_shrunk(vocab_size):
    num_trials = 5000000
    assert num_trials == 200000 and vocab_size in (111, 512, 1024)
'''

# The current suite's helpers come from the checkout itself (tests/test_helpers/test_helpers.py);
# CUDA streams and bit-packed masks are classified out of scope, each with its reason.
FAKE_FLASHINFER_SINGLE = {
    "tests/test_helpers/test_helpers.py": "from flashinfer.utils import GPUArchitectureError\n"
                                          "def ref_scale():\n    return 0.5\n",
    "tests/attention/test_single_prefill.py": '''
import torch
import flashinfer
from tests.test_helpers.test_helpers import ref_scale

def test_uses_the_checkouts_helper():
    q, k = torch.randn(3, 2, 16, device="cuda"), torch.randn(5, 2, 16, device="cuda")
    o = flashinfer.single_prefill_with_kv_cache(q, k, k, sm_scale=ref_scale())
    ref = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * ref_scale(), -1)
    torch.testing.assert_close(o, torch.einsum("hqk,khd->qhd", ref, k), atol=1e-4, rtol=1e-4)

def test_stream():
    torch.cuda.Stream()

def test_packed_custom_mask():
    q = torch.randn(3, 2, 16, device="cuda")
    flashinfer.single_prefill_with_kv_cache(q, q, q, packed_custom_mask=torch.ones(2, dtype=torch.uint8))
''',
}

FAKE_VLLM = {
    "tests/kernels/moe/test_fused_topk.py": '''
import pytest
import torch
from tests.utils import requires_platform
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk
from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import fused_topk_bias

@requires_platform("cuda")
@pytest.mark.parametrize("scoring_func", ["softmax", "sigmoid"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_topk(scoring_func, with_bias):
    g = torch.randn(33, 16, dtype=torch.bfloat16, device="cuda")
    h = torch.randn(33, 64, dtype=torch.bfloat16, device="cuda")
    s = torch.softmax(g.float(), -1) if scoring_func == "softmax" else torch.sigmoid(g.float())
    bias = torch.randn(16, device="cuda") if with_bias else None
    _, ref_ids = torch.topk(s if bias is None else s + bias, 4, dim=-1)
    if with_bias:
        w, ids = fused_topk_bias(h, g, bias, 4, True, scoring_func=scoring_func)
    else:
        w, ids, _ = fused_topk(h, g, 4, True, scoring_func=scoring_func)
    torch.testing.assert_close(ids, ref_ids.to(torch.int32), atol=0, rtol=0)
''',
    "tests/kernels/moe/test_moe_align_block_size.py": '''
import torch
from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
from vllm.utils import round_up

def test_unused_expert_blocks_are_zero():
    ids = torch.stack([torch.randperm(8, device="cuda")[:2] for _ in range(5)]).to(torch.int32)
    s, e, n = moe_align_block_size(topk_ids=ids, block_size=4, num_experts=8, pad_sorted_ids=True)
    assert s.numel() == round_up(10 + 8 * 3, 4)
    assert (e[n.item() // 4:] == 0).all()
''',
    "tests/kernels/core/test_pos_encoding.py": '''
import pytest
import torch
from tests.kernels.allclose_default import get_default_atol, get_default_rtol
from vllm.model_executor.layers.rotary_embedding import get_rope

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.half])
@pytest.mark.parametrize("is_neox_style", [True, False])
def test_rotary_embedding(dtype, is_neox_style):
    torch.set_default_device("cuda")
    rope = get_rope(64, 64, 4096, 10000, is_neox_style, dtype=dtype)
    pos = torch.randint(0, 4096, (2, 33))
    q = torch.randn(2, 33, 4 * 64, dtype=dtype)
    k = torch.randn_like(q)
    ref_q, ref_k = rope.forward_native(pos, q, k)
    out_q, out_k = rope.forward(pos, q.clone(), k.clone())
    torch.testing.assert_close(out_q, ref_q, atol=get_default_atol(out_q), rtol=get_default_rtol(out_q))
    torch.testing.assert_close(out_k, ref_k, atol=get_default_atol(out_k), rtol=get_default_rtol(out_k))

def test_current_get_rope():  # vLLM's current signature: theta and the rotary fraction in a dict
    params = {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.5}
    rope = get_rope(64, 4096, False, params).to(dtype=torch.bfloat16)
    assert rope.rotary_dim == 32
    pos, q = torch.randint(0, 4096, (7,)), torch.randn(7, 3, 64, dtype=torch.bfloat16)
    ref_q, _ = rope.forward_native(pos, q, None)
    out_q, _ = rope.forward(pos, q.clone(), None)
    torch.testing.assert_close(out_q, ref_q, atol=get_default_atol(out_q), rtol=get_default_rtol(out_q))
''',
}


def test_runner_flashinfer_attention_and_sizes(tmp_path):
    (tmp_path / "tests" / "attention").mkdir(parents=True)
    (tmp_path / "tests" / "utils").mkdir()
    (tmp_path / "tests" / "attention" / "test_batch_decode_kernels.py").write_text(FAKE_FLASHINFER_DECODE)
    (tmp_path / "tests" / "utils" / "test_sampling.py").write_text(FAKE_FLASHINFER_SAMPLING)
    rep = _load_runner().run("flashinfer", tmp_path, "cpu", 6, 0, "", 600.0, [])
    t = rep["totals"]
    assert t["failed"] == 0, rep["failures"] or rep["pytest_tail"]
    assert t["passed"] >= 3 + 3 and t["out_of_scope"] >= 1, rep["tests"]  # 6 sampled decode cases, fp8 ones out
    assert set(rep["out_of_scope_reasons"]) == {"fp8 / fp4 KV cache"}


def _run_files(suite, files, tmp_path):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return _load_runner().run(suite, tmp_path, "cpu", 0, 0, "", 600.0, [])


def test_runner_flashinfer_checkout_helpers_and_scope(tmp_path):
    rep = _run_files("flashinfer", FAKE_FLASHINFER_SINGLE, tmp_path)
    t = rep["totals"]
    assert t["failed"] == 0 and t["passed"] == 1 and t["out_of_scope"] == 2, rep["failures"] or rep["pytest_tail"]
    assert {r.split(" ")[0] for r in rep["out_of_scope_reasons"]} == {"CUDA", "multi-item"}


def test_runner_current_vllm_moe_and_rotary(tmp_path):
    rep = _run_files("vllm", FAKE_VLLM, tmp_path)
    t = rep["totals"]
    assert t["failed"] == 0 and t["passed"] == 4 + 1 + 4 + 1, rep["failures"] or rep["pytest_tail"]
