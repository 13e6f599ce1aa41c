"""The logits path's softmax over many blocks of a row: each block exponentiated against its own
maximum and rescaled by the row's (CPU), so rows whose maximum, -inf stretches and NaNs sit in
different blocks, and rows shared by a team of threads, are checked against an fp64 softmax; plain
draws (the block masses only) against the probability path's draws on that softmax; greedy
limits (temperature 0, or too small to invert) against the argmax."""
import pytest
import torch

import llmkern

BLOCK = 2048  # the CPU kernels' block of a row


def _rows(V, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, V, generator=g) * 4
    x[1, BLOCK:2 * BLOCK] = float("-inf")   # a whole block with nothing finite
    x[1, 5::97] = float("nan")              # NaN logits: weight 0
    x[2, : V // 2] -= 300.0                 # first blocks far below the maximum: their factor underflows
    x[3, -1] = 40.0                         # the maximum in the tail of the last block
    x[4, :] = 1.0                           # all equal: uniform
    return x


def _ref(x, temp):
    x = x.double().nan_to_num(nan=float("-inf"))
    return torch.softmax(x / temp, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_over_blocks_matches_fp64(backend, dtype):
    V = 1300 if backend.emulated else 3 * BLOCK + 301
    x = _rows(V).to(dtype)
    for temp in (1.0, 0.37):
        got = llmkern.softmax(x.to(backend.device), temp).cpu().double()
        torch.testing.assert_close(got, _ref(x, temp), atol=1e-7, rtol=2e-5)
        assert not got.isnan().any() and (got[1, 5::97] == 0).all()  # NaN logits: weight 0
        assert torch.allclose(got.sum(-1), torch.ones(5, dtype=torch.float64), atol=1e-5)


def test_softmax_of_a_row_shared_by_threads(native_backend):
    # one long row: the CPU kernels split it over every thread (a team), block by block
    V = (1 << 18) + 777
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, V, generator=g) * 6
    x[0, 100_000:120_000] = float("-inf")
    got = llmkern.softmax(x.to(native_backend.device), 0.8).cpu().double()
    torch.testing.assert_close(got, _ref(x, 0.8), atol=1e-8, rtol=2e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_plain_draws_equal_the_probability_path_on_the_softmax(backend, masked):
    # a plain draw reads block masses only; the probability path computes its full statistics on
    # the softmax's floats: the same generator state must give the same tokens
    V = 1300 if backend.emulated else 3 * BLOCK + 301
    x = _rows(V, seed=1).to(backend.device)
    rows = x.shape[0]
    bm = None
    if masked:
        g = torch.Generator().manual_seed(5)
        bm = torch.randint(-2**31, 2**31 - 1, (rows, (V + 31) // 32), generator=g, dtype=torch.int32)
        bm[:, 0] |= 1  # every row keeps at least token 0
        bm = bm.to(backend.device)
    idx = torch.arange(rows).repeat(40).to(backend.device)
    for temp in (1.0, 0.6):
        got = llmkern.sampling_from_logits(x, indices=idx, temperature=temp, seed=11, offset=3,
                                           token_bitmask=None if bm is None else bm[idx])  # a mask per draw
        probs = llmkern.softmax(x, temp, token_bitmask=bm)
        want = llmkern.sampling_from_probs(probs, indices=idx, seed=11, offset=3)
        assert torch.equal(got.cpu(), want.cpu())


def test_greedy_limits(backend):
    V = 1300 if backend.emulated else 3 * BLOCK + 301
    x = _rows(V, seed=2)
    x[0, [17, V - 5]] = 50.0  # a tied maximum in two blocks: the first index wins
    dev = backend.device
    want = x.nan_to_num(nan=float("-inf")).argmax(-1)
    for temp in (0.0, 1e-40):  # 1 / 1e-40 overflows fp32: the T -> 0 limit, not NaN weights
        probs = llmkern.softmax(x.to(dev), temp).cpu()
        assert torch.equal(probs, torch.nn.functional.one_hot(want, V).float())
        assert torch.equal(llmkern.sampling_from_logits(x.to(dev), temperature=temp, seed=0).cpu().long(), want)
    # masked greedy: the first allowed maximum
    bm = torch.full((5, (V + 31) // 32), -1, dtype=torch.int32)
    bm[0, 0] &= ~(1 << 17)  # token 17 disallowed: the tie in the last blocks wins
    got = llmkern.softmax(x.to(dev), 0.0, token_bitmask=bm.to(dev)).cpu()
    assert got[0].argmax().item() == V - 5 and got[0].sum().item() == 1.0


def test_avx512_and_avx2_levels_give_the_same_bits():
    # The AVX-512 exponential (vrndscaleps / vscalefps) against the AVX2 build's portable one, and
    # the fused exp-and-sum loop at one and two native vectors per 16-lane group: softmax weights,
    # plain and filtered draws, bf16 rows, a row's tail block.
    from runtime_helpers import run_python

    info = llmkern.build_info()
    if info["cpu_simd_supported"] not in ("avx512", "amx") or "avx512" not in info["cpu_simd_compiled"]:
        pytest.skip("needs a CPU with the AVX-512 level and a build with it")
    code = (
        "import hashlib, torch, llmkern\n"
        "g = torch.Generator().manual_seed(0); h = hashlib.sha256()\n"
        "for V in (3 * 2048 + 77, 2048, 130):\n"
        "    x = torch.randn(5, V, generator=g) * 30\n"
        "    x[1, ::7] = float('-inf'); x[2, 3] = float('nan'); x[3, :] = -126.0; x[3, 5] = 0.0\n"
        "    for dt in (torch.float32, torch.bfloat16):\n"
        "        for t in (0.8, 0.05):\n"
        "            h.update(llmkern.softmax(x.to(dt), temperature=t).numpy().tobytes())\n"
        "            h.update(llmkern.sampling_from_logits(x.to(dt), temperature=t, seed=7, offset=0).numpy().tobytes())\n"
        "            h.update(llmkern.top_k_top_p_sampling_from_logits(x.to(dt), top_k=0, top_p=0.9, temperature=t,\n"
        "                                                              seed=3, offset=0).numpy().tobytes())\n"
        "print(llmkern.build_info()['cpu_simd'], h.hexdigest())\n"
    )
    got = {isa: run_python(code, LLMKERN_CPU_ISA=isa).split() for isa in ("avx2", "avx512")}
    assert [got[isa][0] for isa in ("avx2", "avx512")] == ["avx2", "avx512"]
    assert got["avx2"][1] == got["avx512"][1]
