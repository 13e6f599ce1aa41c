"""linear_small_m (decode GEMV) against torch.nn.functional.linear in fp32."""
import pytest
import torch
import torch.nn.functional as F

import llmkern

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,k,n", [(1, 576, 1728), (3, 576, 577), (16, 1536, 576), (2, 1000, 33), (5, 520, 9)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_fp32_linear(dtype, rows, k, n, bias):
    x = torch.randn(rows, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    same = F.linear(x, w, b).float()  # torch in the same dtype: the error budget
    out = llmkern.linear_small_m(x, w, b)
    assert out.dtype == dtype and out.shape == (rows, n)
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * (same - ref).abs().max().item() + TOL[dtype] * ref.abs().max().item()


def test_strided_rows_and_weight_view():
    big = torch.randn(4, 700)
    x = big[:, 50:626]  # row stride 700, as a slice of a fused activation
    w_full = torch.randn(300, 640)
    w = w_full[:, :576]  # weight rows contiguous, row stride 640
    torch.testing.assert_close(llmkern.linear_small_m(x, w), F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=2e-4)  # K=576 sums of O(1) terms


def test_empty():
    assert llmkern.linear_small_m(torch.zeros(0, 8), torch.zeros(3, 8)).shape == (0, 3)


def test_opcheck_and_compile():
    x, w, b = torch.randn(2, 64), torch.randn(40, 64), torch.randn(40)
    torch.library.opcheck(llmkern.linear_small_m.op, (x, w, b))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return llmkern.linear_small_m(x * 2, w, b)

    torch.testing.assert_close(f(x), F.linear(x * 2, w, b), rtol=1e-5, atol=1e-5)


# linear_packed: the register-tiled GEMM on pre-packed weights. Rows cover every tile height and
# the row-block split (AVX-512 tiles are 12 rows, AVX2 6, SSE 2), N covers the padded last panel and
# a lone panel after the pairs, K covers the k chunks (2048), and the last two the row super-blocks
# of 512 KB of x (several, a partial last one; with k chunks).
PACKED_CASES = [(1, 64, 16), (2, 576, 960), (3, 100, 33), (5, 576, 577), (13, 576, 48), (24, 1536, 576),
                (37, 200, 100), (64, 96, 1000), (150, 64, 40), (7, 4100, 50), (300, 1000, 40), (130, 4100, 20)]


def _packed_ref(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("rows,k,n", PACKED_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_fp64_linear(rows, k, n, bias):
    x = torch.randn(rows, k)
    w = torch.randn(n, k) / k**0.5
    b = torch.randn(n) if bias else None
    p = llmkern.pack_linear_weight(w)
    assert p.shape == ((n + 15) // 16, k, 16)
    out = llmkern.linear_packed(x, p, n, b)
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    ref = _packed_ref(x, w, b)
    err = (out.double() - ref).abs().max().item()
    same = (F.linear(x, w, b).double() - ref).abs().max().item()  # torch's own fp32 error
    assert err <= 2 * same + 1e-6 * k**0.5


@pytest.mark.parametrize("gated", [False, True])
def test_packed_x_packed_by_its_readers_is_thread_count_invariant(gated):
    # 700 x 1000 strided rows: several row super-blocks whose x the two threads' work items pack on
    # demand into a scratch buffer kept between calls (a single thread packs it all up front). A new
    # x per call, so a block read before it is packed shows the previous call's rows. The tiles do
    # not depend on the thread count, so the bits must not either, and both must be torch's result.
    k, n = 1000, 96
    xs = [torch.randn(700, k + 24)[:, 3:3 + k] for _ in range(4)]
    w = torch.randn(2 * n if gated else n, k) / k**0.5
    h = [_packed_ref(x, w, None) for x in xs]
    if gated:
        p = llmkern.pack_gate_up_weight(w[:n], w[n:])
        run = lambda x: llmkern.linear_packed_silu_mul(x, p, n)  # noqa: E731
        refs = [F.silu(r[:, :n]) * r[:, n:] for r in h]
    else:
        p = llmkern.pack_linear_weight(w)
        run = lambda x: llmkern.linear_packed(x, p, n)  # noqa: E731
        refs = h
    threads = llmkern.get_num_threads()
    try:
        llmkern.set_num_threads(1)
        one = [run(x) for x in xs]
        llmkern.set_num_threads(2)
        two = [run(x) for x in xs]
    finally:
        llmkern.set_num_threads(threads)
    for a, b, ref in zip(one, two, refs):
        assert torch.equal(b, a)
        assert (a.double() - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
def test_packed_rows_do_not_depend_on_the_batch(dtype, gated):
    """A row's result is the same bits whatever number of rows it comes with (1 .. 40: thin decode
    tiles, partial row blocks, several blocks): every tile keeps one accumulator per output and
    sums k in order. The engine's decode rows then do not change with the batch."""
    if dtype == torch.bfloat16 and llmkern.build_info()["cpu_kernels"]["linear bf16"].startswith("amx-bf16"):
        pytest.skip("AMX tiles take over from their row threshold and sum k in their own order")
    torch.manual_seed(0)
    k, n = 576, 200
    w = (torch.randn(2 * n if gated else n, k) / k ** 0.5).to(dtype)
    x = torch.randn(40, k).to(dtype)
    bf16 = dtype == torch.bfloat16
    if gated:
        p = (llmkern.pack_gate_up_weight_bf16 if bf16 else llmkern.pack_gate_up_weight)(w[:n], w[n:])
        run = lambda a: llmkern.linear_packed_silu_mul(a, p, n)  # noqa: E731
    else:
        p = (llmkern.pack_linear_weight_bf16 if bf16 else llmkern.pack_linear_weight)(w)
        run = lambda a: llmkern.linear_packed(a, p, n)  # noqa: E731
    full = run(x)
    for m in range(1, 40):
        assert torch.equal(run(x[:m]), full[:m]), m


def test_packed_layout_and_strided_rows():
    w = torch.randn(20, 8)
    p = llmkern.pack_linear_weight(w)
    assert torch.equal(p[1, 3, :4], w[16:20, 3]) and not p[1, :, 4:].any()  # k-major panels, zero-padded
    big = torch.randn(30, 700)
    x = big[:, 50:626]  # row stride 700, as a slice of a fused activation
    w = torch.randn(300, 576)
    torch.testing.assert_close(llmkern.linear_packed(x, llmkern.pack_linear_weight(w), 300),
                               F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=2e-4)


def test_packed_empty_and_compile():
    p = llmkern.pack_linear_weight(torch.randn(3, 8))
    assert llmkern.linear_packed(torch.zeros(0, 8), p, 3).shape == (0, 3)
    b0 = torch.randn(5)
    assert torch.equal(llmkern.linear_packed(torch.zeros(2, 0), llmkern.pack_linear_weight(torch.zeros(5, 0)), 5, b0),
                       b0.expand(2, 5))
    x, w, b = torch.randn(2, 64), torch.randn(40, 64), torch.randn(40)
    p = llmkern.pack_linear_weight(w)
    torch.library.opcheck(llmkern.linear_packed.op, (x, p, 40, b))
    torch.library.opcheck(llmkern.pack_linear_weight.op, (torch.randn(21, 8),))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return llmkern.linear_packed(x * 2, p, 40, b)

    torch.testing.assert_close(f(x), F.linear(x * 2, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_packed_other_simd_levels(isa):
    """Each SIMD level has its own tile shape; the level is read once per process."""
    from runtime_helpers import run_python

    code = (
        "import torch, llmkern, torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        f"for rows, k, n in {PACKED_CASES!r}:\n"
        "    x = torch.randn(rows, k); w = torch.randn(n, k) / k ** 0.5; b = torch.randn(n)\n"
        "    out = llmkern.linear_packed(x, llmkern.pack_linear_weight(w), n, b)\n"
        "    ref = F.linear(x.double(), w.double(), b.double())\n"
        "    assert (out.double() - ref).abs().max() < 1e-4, (rows, k, n)\n"
    )
    run_python(code, LLMKERN_CPU_ISA=isa)


@pytest.mark.parametrize("n,k", [(20, 8), (49152 // 64, 576), (33, 100)])
def test_packed_weight_rows_is_an_embedding_lookup(n, k):
    w = torch.randn(n, k)
    ids = torch.randint(0, n, (70,))
    p = llmkern.pack_linear_weight(w)
    assert torch.equal(llmkern.packed_weight_rows(p, n, ids), F.embedding(ids, w))
    assert torch.equal(llmkern.packed_weight_rows(p, n, ids.int()[:3]), w[ids[:3]])
    assert llmkern.packed_weight_rows(p, n, ids[:0]).shape == (0, k)
    torch.library.opcheck(llmkern.packed_weight_rows.op, (p, n, ids))


# (rows, in_features, inter): decode and prefill row counts on both sides of the 4-row tile switch,
# SmolLM2's MLP (576 -> 1536), K beyond one 2048 chunk, inter not a multiple of 16.
GATED_CASES = [(1, 576, 1536), (3, 64, 48), (4, 100, 32), (5, 576, 64), (13, 96, 160), (37, 200, 96),
               (2, 4100, 32), (9, 4100, 16), (6, 64, 40), (1, 8, 7), (260, 1000, 48)]


def _gated_ref(x, gate, up):
    x = x.double()
    return F.silu(F.linear(x, gate.double())) * F.linear(x, up.double())


@pytest.mark.parametrize("rows,k,inter", GATED_CASES)
def test_packed_silu_mul_matches_torch_and_the_unfused_path(rows, k, inter):
    x = torch.randn(rows, k)
    gate, up = torch.randn(inter, k) / k**0.5, torch.randn(inter, k) / k**0.5
    pairs = llmkern.pack_gate_up_weight(gate, up)
    assert pairs.shape == (2 * ((inter + 15) // 16), k, 16)
    out = llmkern.linear_packed_silu_mul(x, pairs, inter)
    assert out.dtype == torch.float32 and out.shape == (rows, inter)
    ref = _gated_ref(x, gate, up)
    err = (out.double() - ref).abs().max().item()
    same = (F.silu(F.linear(x, gate)) * F.linear(x, up)).double().sub(ref).abs().max().item()  # torch fp32
    assert err <= 2 * same + 1e-6 * k**0.5
    # The unfused path: the concatenated weight's GEMM, then silu_and_mul.
    gu = llmkern.linear_packed(x, llmkern.pack_linear_weight(torch.cat([gate, up])), 2 * inter)
    unfused = torch.empty(rows, inter)
    llmkern.silu_and_mul(unfused, gu)
    if inter % 16 == 0:
        assert torch.equal(out, unfused)
    else:  # the unfused panels straddle gate and up: last-bit differences only
        torch.testing.assert_close(out, unfused, rtol=1e-5, atol=1e-6)


def test_packed_silu_mul_layer_errors_and_compile():
    from llmkern.layers import GateUpLinear, Linear
    from llmkern.layers.activation import silu_and_mul

    x, gate, up = torch.randn(6, 64), torch.randn(48, 64), torch.randn(48, 64)
    fused = GateUpLinear(gate, up)
    assert fused.fused and torch.equal(fused(x), silu_and_mul(Linear(torch.cat([gate, up]))(x)))
    # a bias takes Linear + silu_and_mul (bf16 is fused too: tests/test_linear_bf16.py)
    b = torch.randn(96)
    plain = GateUpLinear(gate, up, b)
    assert not plain.fused
    assert torch.equal(plain(x), silu_and_mul(Linear(torch.cat([gate, up]), b)(x)))
    pairs = llmkern.pack_gate_up_weight(gate, up)
    assert llmkern.linear_packed_silu_mul(torch.zeros(0, 64), pairs, 48).shape == (0, 48)
    assert not llmkern.linear_packed_silu_mul(torch.zeros(2, 0), llmkern.pack_gate_up_weight(
        torch.zeros(48, 0), torch.zeros(48, 0)), 48).any()
    with pytest.raises(ValueError, match="out_features"):
        llmkern.linear_packed_silu_mul(x, pairs, 49)
    with pytest.raises(ValueError, match="weight_pairs"):
        llmkern.linear_packed_silu_mul(x, llmkern.pack_linear_weight(gate), 48)
    with pytest.raises(ValueError, match="in_features"):
        llmkern.linear_packed_silu_mul(torch.randn(2, 63), pairs, 48)
    with pytest.raises(ValueError, match="up"):
        llmkern.pack_gate_up_weight(gate, up[:40])
    torch.library.opcheck(llmkern.linear_packed_silu_mul.op, (x, pairs, 48))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return llmkern.linear_packed_silu_mul(x * 2, pairs, 48)

    torch.testing.assert_close(f(x), F.silu(F.linear(x * 2, gate)) * F.linear(x * 2, up), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_packed_silu_mul_other_simd_levels(isa):
    from runtime_helpers import run_python

    code = (
        "import torch, llmkern\n"
        "torch.manual_seed(0)\n"
        f"for rows, k, inter in {GATED_CASES!r}:\n"
        "    x = torch.randn(rows, k); g = torch.randn(inter, k) / k ** 0.5; u = torch.randn(inter, k) / k ** 0.5\n"
        "    out = llmkern.linear_packed_silu_mul(x, llmkern.pack_gate_up_weight(g, u), inter)\n"
        "    gu = llmkern.linear_packed(x, llmkern.pack_linear_weight(torch.cat([g, u])), 2 * inter)\n"
        "    ref = torch.empty(rows, inter); llmkern.silu_and_mul(ref, gu)\n"
        "    assert (torch.equal(out, ref) if inter % 16 == 0 else torch.allclose(out, ref, rtol=1e-5, atol=1e-6)), (rows, k, inter)\n"
    )
    run_python(code, LLMKERN_CPU_ISA=isa)
