"""The bf16 packed GEMM (pack_linear_weight_bf16 + linear_packed / linear_packed_silu_mul) against
fp64 matmuls of the same bf16 inputs; the widening path (no AVX512_BF16) and the other SIMD levels
against the same reference; the layers that use it."""
import pytest
import torch
import torch.nn.functional as F

import llmkern

# (rows, in_features, out_features): every tile height 1..12 and the row-block split (AVX-512 12,
# AVX2 6, SSE 2 rows per tile), rows 1..40 and a prefill-sized 300, N not a multiple of 16 and a
# lone panel after the pairs, odd K, K beyond one 1024-pair chunk.
CASES = [(1, 576, 576), (2, 64, 16), (3, 577, 33), (4, 100, 48), (5, 575, 577), (7, 4100, 50), (8, 96, 1000),
         (12, 31, 17), (13, 576, 48), (24, 1536, 200), (31, 9, 40), (37, 200, 100), (40, 577, 192),
         (300, 576, 80), (600, 1000, 40)]


def _inputs(rows, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    return x, w, b


def _tol(ref):
    """The output is rounded to bf16 once: half an ulp (2^-8 relative), plus fp32 summation order."""
    return ref.abs() * 2.0**-8 + 1e-5 * ref.abs().max()


def _check(out, ref):
    assert out.dtype == torch.bfloat16
    err = (out.double() - ref).abs()
    bad = err > _tol(ref)
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} entries off; worst {err.max().item():.3g}"


@pytest.mark.parametrize("rows,k,n", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_bf16_matches_fp64(rows, k, n, bias):
    x, w, b = _inputs(rows, k, n)
    b = b if bias else None
    p = llmkern.pack_linear_weight_bf16(w)
    assert p.dtype == torch.bfloat16 and p.shape == ((n + 15) // 16, (k + 1) // 2, 16, 2)
    out = llmkern.linear_packed(x, p, n, b)
    assert out.shape == (rows, n)
    _check(out, F.linear(x.double(), w.double(), None if b is None else b.double()))


@pytest.mark.parametrize("rows,k,n", CASES)
def test_packed_bf16_fp32_out_holds_the_bf16_results(rows, k, n):
    """For bf16 x, linear_packed_into's fp32 out is the bf16 output widened, bit for bit (the LM
    head's logits; _OTHER_PATH checks the same on the other SIMD levels and the AMX model)."""
    from llmkern.ops.linear import linear_packed_into

    x, w, b = _inputs(rows, k, n)
    p = llmkern.pack_linear_weight_bf16(w)
    for bias in (None, b):
        out = linear_packed_into(x, p, n, bias, torch.empty(rows, n))
        assert torch.equal(out, llmkern.linear_packed(x, p, n, bias).float())
    with pytest.raises(TypeError, match="out"):
        linear_packed_into(x, p, n, None, torch.empty(rows, n, dtype=torch.float16))


@pytest.mark.parametrize("rows,n", [(2, 40), (16, 40), (64, 33)])
def test_packed_bf16_rounds_to_nearest_even(rows, n):
    """Exact fp32 sums that bf16 cannot hold (ties among them) and inf/NaN through the epilogue's
    vector and per-column stores, below and on the AMX row count: rounded as torch rounds."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-40, 41, (rows, 8), generator=g).bfloat16()
    w = torch.randint(-40, 41, (n, 8), generator=g).bfloat16()
    b = torch.randint(-300, 301, (n,), generator=g).bfloat16()
    x[0, 0], x[-1, 1] = float("inf"), float("nan")
    for bias in (None, b):
        ref = x.float() @ w.float().T + (0 if bias is None else bias.float())   # integers: exact in fp32
        out = llmkern.linear_packed(x, llmkern.pack_linear_weight_bf16(w), n, bias)
        assert torch.equal(out.isnan(), ref.isnan())
        assert torch.equal(out[~ref.isnan()], ref.bfloat16()[~ref.isnan()])


@pytest.mark.parametrize("rows,n", [(2, 40), (16, 40), (64, 33)])
def test_packed_bf16_keeps_denormals(rows, n):
    """Denormal sums reach the epilogue only through the bias (the products flush them), and must
    round as torch rounds them, not to zero as the CPU's vcvtneps2bf16 would; one denormal lane
    sends its whole vector to the software rounding, the other rows stay on the instruction."""
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-40, 41, (rows, 8), generator=g).bfloat16()
    x[::2] = 0  # these rows' sums are the bias alone
    w = torch.randint(-40, 41, (n, 8), generator=g).bfloat16()
    tiny = torch.tensor([2.0**-127, -(2.0**-130), 2.0**-133 * 3, -(2.0**-149) * 0, 1.5 * 2.0**-126])
    b = torch.randint(-300, 301, (n,), generator=g).float()
    b[::3] = tiny.repeat(n)[: len(b[::3])]
    b = b.bfloat16()
    assert (b.float().abs() < 2.0**-126).any() and (b.float() != 0).any()
    ref = x.float() @ w.float().T + b.float()
    out = llmkern.linear_packed(x, llmkern.pack_linear_weight_bf16(w), n, b)
    assert torch.equal(out, ref.bfloat16())
    assert (out[::2].float().abs() < 2.0**-126).logical_and(out[::2] != 0).any()


def test_pair_layout_and_strided_rows():
    w = torch.randn(20, 7).bfloat16()
    p = llmkern.pack_linear_weight_bf16(w)
    # W[16p + f, 2h + e] at [p, h, f, e]; padded features and the odd k's partner are zero
    assert torch.equal(p[1, 1, :4, 1], w[16:20, 3]) and torch.equal(p[0, 3, :, 0], w[:16, 6])
    assert not p[1, :, 4:].any() and not p[:, 3, :, 1].any()
    w = torch.randn(300, 577).bfloat16()
    p = llmkern.pack_linear_weight_bf16(w)
    # Slices of a fused activation: row stride 700 (a k pair is one aligned word of the row), or an
    # odd stride and start (pairs straddle words: x is packed element by element); 3 rows stay on
    # the AVX-512 GEMM where AMX takes 30.
    for stride, start in ((700, 50), (701, 51)):
        big = torch.randn(30, stride).bfloat16()
        for rows in (3, 30):
            x = big[:rows, start:start + 577]
            _check(llmkern.linear_packed(x, p, 300), F.linear(x.double(), w.double()))


def _gated_ref(x, gate, up):
    x = x.double()
    return F.silu(F.linear(x, gate.double())) * F.linear(x, up.double())


@pytest.mark.parametrize("rows,k,inter", [(1, 576, 1536), (3, 64, 48), (4, 101, 32), (5, 576, 64), (13, 96, 160),
                                          (37, 200, 96), (9, 2100, 16), (6, 64, 40), (1, 8, 7), (64, 33, 50)])
def test_packed_bf16_silu_mul_matches_fp64(rows, k, inter):
    x, gate, _ = _inputs(rows, k, inter, seed=1)
    up = _inputs(rows, k, inter, seed=2)[1]
    pairs = llmkern.pack_gate_up_weight_bf16(gate, up)
    assert pairs.shape == (2 * ((inter + 15) // 16), (k + 1) // 2, 16, 2)
    out = llmkern.linear_packed_silu_mul(x, pairs, inter)
    assert out.shape == (rows, inter)
    ref = _gated_ref(x, gate, up)
    # silu_fast's exp is within a few fp32 ulps; the rest is the one bf16 rounding
    assert ((out.double() - ref).abs() <= ref.abs() * 2.0**-8 + 1e-4 * ref.abs().max()).all()


def test_weight_rows_and_empty():
    for n, k in [(20, 8), (33, 101), (768, 576)]:
        w = torch.randn(n, k).bfloat16()
        ids = torch.randint(0, n, (70,))
        p = llmkern.pack_linear_weight_bf16(w)
        assert torch.equal(llmkern.packed_weight_rows(p, n, ids, k), F.embedding(ids, w))
        assert llmkern.packed_weight_rows(p, n, ids[:0], k).shape == (0, k)
    with pytest.raises(ValueError, match="in_features"):
        llmkern.packed_weight_rows(p, n, ids)  # the pair layout cannot tell an odd in_features
    with pytest.raises(ValueError, match="weight_packed"):
        llmkern.packed_weight_rows(p, n, ids, k + 2)
    p = llmkern.pack_linear_weight_bf16(torch.randn(3, 8).bfloat16())
    assert llmkern.linear_packed(torch.zeros(0, 8).bfloat16(), p, 3).shape == (0, 3)
    b0 = torch.randn(5).bfloat16()
    assert torch.equal(llmkern.linear_packed(torch.zeros(2, 0).bfloat16(),
                                             llmkern.pack_linear_weight_bf16(torch.zeros(5, 0)), 5, b0), b0.expand(2, 5))
    gu = llmkern.pack_gate_up_weight_bf16(torch.zeros(6, 0), torch.zeros(6, 0))
    assert not llmkern.linear_packed_silu_mul(torch.zeros(3, 0).bfloat16(), gu, 6).any()


def test_bad_inputs_name_the_argument():
    P = llmkern.pack_linear_weight_bf16(torch.randn(20, 9))  # 2 panels, in_features 9 (5 pairs)
    GU = llmkern.pack_gate_up_weight_bf16(torch.randn(20, 9), torch.randn(20, 9))
    x = torch.randn(2, 9).bfloat16()
    cases = [
        (lambda: llmkern.linear_packed(x.float(), P, 20), TypeError, "x"),
        (lambda: llmkern.linear_packed(x, P, 20, torch.randn(20)), TypeError, "bias"),
        (lambda: llmkern.linear_packed(x, P, 20, torch.randn(19).bfloat16()), ValueError, "bias"),
        (lambda: llmkern.linear_packed(torch.randn(2, 11).bfloat16(), P, 20), ValueError, "weight_packed"),
        (lambda: llmkern.linear_packed(x, P, 40), ValueError, "weight_packed"),
        (lambda: llmkern.linear_packed(x, P.transpose(2, 3).contiguous(), 20), ValueError, "weight_packed"),
        (lambda: llmkern.linear_packed(x, P.half(), 20), TypeError, "weight_packed"),
        (lambda: llmkern.linear_packed(x[:, None], P, 20), ValueError, "x"),
        (lambda: llmkern.linear_packed_silu_mul(x, P, 20), ValueError, "weight_pairs"),
        (lambda: llmkern.linear_packed_silu_mul(x.half(), GU, 20), TypeError, "x"),
        (lambda: llmkern.linear_packed_silu_mul(x, GU, 0), ValueError, "out_features"),
        (lambda: llmkern.pack_linear_weight_bf16(torch.randn(9)), ValueError, "weight"),
        (lambda: llmkern.pack_linear_weight_bf16(torch.ones(4, 8, dtype=torch.int32)), TypeError, "weight"),
        (lambda: llmkern.pack_gate_up_weight_bf16(torch.randn(20, 9), torch.randn(20, 8)), ValueError, "up"),
    ]
    for i, (call, exc, name) in enumerate(cases):
        with pytest.raises(exc, match=name):
            call()


def test_opcheck_and_compile():
    x, w, b = _inputs(3, 65, 40)
    p = llmkern.pack_linear_weight_bf16(w)
    torch.library.opcheck(llmkern.linear_packed.op, (x, p, 40, b))
    torch.library.opcheck(llmkern.pack_linear_weight_bf16.op, (w,))
    gu = llmkern.pack_gate_up_weight_bf16(w, w)
    torch.library.opcheck(llmkern.linear_packed_silu_mul.op, (x, gu, 40))
    torch.library.opcheck(llmkern.packed_weight_rows.op, (p, 40, torch.tensor([3, 39]), 65))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return llmkern.linear_packed(x * 2, p, 40, b)

    _check(f(x), F.linear((x * 2).double(), w.double(), b.double()))


# The widening path (LLMKERN_LINEAR_BF16_DOT=0 on a CPU with AVX512_BF16) and the other SIMD levels
# compute the same sums: within the same tolerance of the fp64 reference. Both are read once per process.
_OTHER_PATH = (
    "import torch, llmkern, torch.nn.functional as F\n"
    "from llmkern.ops.linear import linear_packed_into\n"
    "torch.manual_seed(0)\n"
    "for rows, k, n in {cases!r}:\n"
    "    x = torch.randn(rows, k).bfloat16(); w = (torch.randn(n, k) / k ** 0.5).bfloat16()\n"
    "    b = torch.randn(n).bfloat16(); u = (torch.randn(n, k) / k ** 0.5).bfloat16()\n"
    "    ref = F.linear(x.double(), w.double(), b.double())\n"
    "    p = llmkern.pack_linear_weight_bf16(w); bf = llmkern.linear_packed(x, p, n, b); out = bf.double()\n"
    "    assert ((out - ref).abs() <= ref.abs() * 2 ** -8 + 1e-5 * ref.abs().max()).all(), (rows, k, n)\n"
    "    assert torch.equal(linear_packed_into(x, p, n, b, torch.empty(rows, n)), bf.float()), (rows, k, n)\n"
    "    ref = F.silu(F.linear(x.double(), w.double())) * F.linear(x.double(), u.double())\n"
    "    out = llmkern.linear_packed_silu_mul(x, llmkern.pack_gate_up_weight_bf16(w, u), n).double()\n"
    "    assert ((out - ref).abs() <= ref.abs() * 2 ** -8 + 1e-4 * ref.abs().max()).all(), (rows, k, n)\n"
)


@pytest.mark.parametrize("env", [{"LLMKERN_LINEAR_BF16_DOT": "0"}, {"LLMKERN_CPU_ISA": "avx2"},
                                 {"LLMKERN_CPU_ISA": "scalar"}], ids=["widen-avx512", "avx2", "scalar"])
def test_widening_path_and_other_simd_levels(env):
    from runtime_helpers import run_python

    run_python(_OTHER_PATH.format(cases=CASES[:12]), **env)


def test_decode_rows_same_bits_with_and_without_the_next_panel_prefetch():
    """The GEMMs of 1-4 rows prefetch the next panel group on Intel CPUs and read W as one stream
    elsewhere (LLMKERN_GEMV_PREFETCH forces either): a prefetch moves no result, so both give the
    same bits, plain, gated and with fp32 output, at every row count up to the stream bound."""
    from runtime_helpers import run_python

    code = ("import hashlib, torch, llmkern\n"
            "from llmkern.ops.linear import linear_packed_into\n"
            "torch.manual_seed(0)\n"
            "h = hashlib.sha256()\n"
            "for rows, k, n in [(1, 576, 3072), (2, 577, 1000), (3, 64, 48), (4, 1536, 576), (5, 576, 576)]:\n"
            "    x = torch.randn(rows, k).bfloat16(); w = (torch.randn(n, k) / k ** 0.5).bfloat16()\n"
            "    u = (torch.randn(n, k) / k ** 0.5).bfloat16(); p = llmkern.pack_linear_weight_bf16(w)\n"
            "    outs = [llmkern.linear_packed(x, p, n), linear_packed_into(x, p, n, None, torch.empty(rows, n)),\n"
            "            llmkern.linear_packed_silu_mul(x, llmkern.pack_gate_up_weight_bf16(w, u), n)]\n"
            "    for o in outs: h.update(o.float().numpy().tobytes())\n"
            "print(h.hexdigest())\n")
    on, off = (run_python(code, LLMKERN_GEMV_PREFETCH=v).strip() for v in ("1", "0"))
    assert on and on == off


# The AMX tile GEMM (from 4 rows) through the tiles' software model, so that its blocking, padding
# and epilogues are tested on every AVX-512 CPU: rows 4 .. 600 (a block of fewer rows than one tile,
# partial 16- and 32-row blocks, many row groups), K a multiple of 32 (x read in place; up to 16 k
# chunks) or not (padded copy, a partial tile of k pairs), an odd panel count, K = 0, and row
# super-groups of 512 KB of x (the last case: three, the last partial). On a CPU
# with AMX the default-level tests above run the same GEMM on the hardware tiles.
_AMX_CASES = [(4, 64, 32), (7, 577, 20), (15, 2048, 16), (16, 64, 32), (17, 576, 48), (24, 1536, 200),
              (31, 9, 40), (33, 577, 33), (37, 200, 100), (40, 577, 192), (300, 576, 80), (600, 96, 40),
              (20, 0, 5), (600, 1000, 40)]


def test_amx_tile_gemm_emulated():
    from runtime_helpers import amx_model_or_skip, run_python

    amx_model_or_skip()
    check = ("info = llmkern.build_info()\n"
             "assert info['cpu_amx'] == 'emulated', info\n"
             "assert info['cpu_kernels']['linear bf16'].startswith('amx-bf16 emulated'), info\n")
    code = _OTHER_PATH.format(cases=_AMX_CASES).replace("/ k ** 0.5", "/ max(k, 1) ** 0.5")
    head, body = code.split("torch.manual_seed(0)\n", 1)
    run_python(head + check + "torch.manual_seed(0)\n" + body,
               timeout=300, LLMKERN_CPU_ISA="amx-emulated")


_ROWS_ALONE = (
    "import torch, llmkern\n"
    "torch.manual_seed(0)\n"
    "for k in (1536, 577):\n"
    "    x = torch.randn(96, k).bfloat16(); w = (torch.randn(200, k) / k ** 0.5).bfloat16()\n"
    "    u = (torch.randn(200, k) / k ** 0.5).bfloat16()\n"
    "    p, pg = llmkern.pack_linear_weight_bf16(w), llmkern.pack_gate_up_weight_bf16(w, u)\n"
    "    full, gfull = llmkern.linear_packed(x, p, 200), llmkern.linear_packed_silu_mul(x, pg, 200)\n"
    "    for a, b in ((0, 20), (0, 32), (0, 64), (64, 96)):\n"
    "        assert torch.equal(llmkern.linear_packed(x[a:b], p, 200), full[a:b]), (k, a, b)\n"
    "        assert torch.equal(llmkern.linear_packed_silu_mul(x[a:b], pg, 200), gfull[a:b]), (k, a, b)\n"
)


def test_amx_rows_same_bits_alone_and_within_a_larger_batch():
    """On the AMX tiles a row's result does not depend on how many rows share the call: rows alone
    equal the same rows of a 96-row call, bit for bit, plain and gated. 20 or 32 rows alone are one
    32-row block, whose C tiles stay in the tile registers over all of k; inside the 96 they belong
    to a group of two blocks, which parks its C tiles in memory every 96 k pairs; 64 rows alone are
    such a group; rows 64-95 end the 96 as a group of one. On the hardware tiles where the CPU has
    them, and on their software model."""
    import llmkern
    from runtime_helpers import amx_model_or_skip, run_python

    if llmkern.build_info()["cpu_amx"] == "hardware":
        run_python(_ROWS_ALONE, timeout=300)
    amx_model_or_skip()
    run_python(_ROWS_ALONE, timeout=300, LLMKERN_CPU_ISA="amx-emulated")


def test_layers_use_the_bf16_gemm():
    from llmkern.layers import GateUpLinear, Linear

    x, w, b = _inputs(11, 64, 40)
    lin = Linear(w, b)
    assert lin.packed and lin.weight.shape == (3, 32, 16, 2)
    _check(lin(x), F.linear(x.double(), w.double(), b.double()))
    tied = Linear(w[:, :63].contiguous())  # odd in_features: rows() still gives the weight back
    ids = torch.tensor([0, 39, 7])
    assert torch.equal(tied.rows(ids), w[ids, :63])
    up = _inputs(11, 64, 40, seed=3)[1]
    gu = GateUpLinear(w, up)
    assert gu.fused
    ref = _gated_ref(x, w, up)
    assert ((gu(x).double() - ref).abs() <= ref.abs() * 2.0**-8 + 1e-4 * ref.abs().max()).all()


@pytest.mark.parametrize("arch,kw", [("llama", {}), ("qwen2", {"tie_word_embeddings": True})], ids=["llama", "qwen2-bias-tied"])
def test_engine_bf16_greedy_follows_the_fp32_model(tmp_path, arch, kw):
    """Every projection of a bf16 engine runs the bf16 GEMM (prefill rows, batched and single decode
    rows, a tied head's lookups). Each greedy token must be the fp32 HF model's argmax up to bf16
    noise, and its logprob that model's: measured ~0.025 nats off for both the bf16 GEMM and torch's
    bf16 F.linear; a wrong GEMM is off by whole nats."""
    pytest.importorskip("numpy", reason="the runtime needs numpy")
    pytest.importorskip("transformers")
    import random

    from llmkern import LLM, SamplingParams
    from runtime_helpers import tiny_hf_model

    hf = tiny_hf_model(str(tmp_path), arch, intermediate_size=136, **kw)  # inter not a multiple of 16
    llm = LLM(str(tmp_path), dtype="bfloat16", num_gpu_blocks=64, block_size=16)
    assert llm.engine.model.lm_head.packed
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 9, 17, 40, 25)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0),
                        use_tqdm=False)
    tol = 0.1
    for p, o in zip(prompts, outs):
        c = o.outputs[0]
        with torch.no_grad():
            logp = hf(torch.tensor([p + c.token_ids])).logits[0].double().log_softmax(-1)
        for i, t in enumerate(c.token_ids):
            row = logp[len(p) - 1 + i]
            assert row.max() - row[t] <= tol, (p, i, t, row.argmax().item())
            assert abs(c.logprobs[i][0] - row[t].item()) <= tol, (p, i)
