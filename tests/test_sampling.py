"""Sampling ops: exact supports against a sorting reference (ties included), distributions with
fixed seeds and chi-square tests (goodness_of_fit.py), the Philox stream, reproducibility across thread counts,
renormalisation / masking, penalties, NaN handling, torch.library registration.

The kernel tests run on every backend (`backend` fixture: cpu, simt = the CUDA sources on the
emulator, cuda). The emulator runs every thread of every CTA, so on `simt` the tests use shorter
rows and fewer draws, with bounds computed for the draws taken, and in addition check that the
CUDA kernels agree with the CPU kernels (same seed -> same tokens, same kept sets)."""
import contextlib
import math

import pytest
import torch

import llmkern
from goodness_of_fit import assert_follows, follows
from reference import (
    ref_apply_penalties,
    ref_filtered_probs,
    ref_keep,
    ref_philox4x32_10,
    ref_top_k_keep,
    ref_top_p_keep,
    ref_uniform,
)

V_BIG = 5000  # > one 2048-element block: multi-block passes and compaction run
V_EMU = 1500  # rows on the emulator: several chunks of a CTA pass, few enough for the emulator


def vocab(backend):
    return V_EMU if backend.emulated else V_BIG


def n_draws(backend, n, emulated_n):
    return emulated_n if backend.emulated else n


@contextlib.contextmanager
def cpu_kernels():
    """Run the C++ CPU kernels even inside the simt fixture (for cross-backend comparisons)."""
    from llmkern import _backend

    prev = getattr(_backend._state, "lib", None)
    _backend._state.lib = None
    try:
        yield
    finally:
        _backend._state.lib = prev


def on_cpu(fn, *args, **kw):
    """fn on CPU copies of the tensor arguments, through the CPU kernels."""
    mv = lambda v: v.cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
    with cpu_kernels():
        return fn(*[mv(a) for a in args], **{k: mv(v) for k, v in kw.items()})


def agrees_with_cpu(backend, got, fn, *args, min_rate=0.98, **kw):
    """On simt/cuda: the same call on the CPU kernels draws the same tokens (the kernels share the
    pivot rules and the Philox stream; only rounding differences of sums may flip a rare draw)."""
    if backend.name == "cpu":
        return
    want = on_cpu(fn, *args, **kw)
    rate = (got.cpu() == want).double().mean().item()
    assert rate >= min_rate, f"only {rate:.4f} of the draws match the CPU kernels"


def head_tail_row(vocab=V_BIG, seed=0):
    """A row with a head of 40 large weights (planted ties) and a long tail of small ones."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(vocab, generator=g) * 0.01
    head = torch.randperm(vocab, generator=g)[:40]
    vals = torch.sort(1.0 + torch.rand(40, generator=g), descending=True).values
    vals[5:9] = vals[4]    # the 5th largest is tied with the next four
    vals[20:24] = vals[19]  # ... and the 20th with the next four
    w[head] = vals
    return w


def safe_top_p(w, target):
    """A top_p whose threshold is far (>= 1e-5 of the mass; fp32 partial sums err by ~1e-6) from any token's strictly-greater mass,
    so that rounding cannot move the boundary: the midpoint of the gap around `target`."""
    s = torch.sort(w.double()[w > 0], descending=True).values
    excl = torch.unique(torch.cumsum(s, 0) - s) / s.sum()
    hi = excl[excl > target]
    lo = excl[excl <= target]
    a = lo.max().item() if lo.numel() else 0.0
    b = hi.min().item() if hi.numel() else 1.0
    assert b - a > 2e-5, "choose another target"
    return (a + b) / 2


def draws(fn, w, n, backend=None, **kw):
    """n draws from the same row through `indices` (each output row has its own random stream).
    On simt/cuda the draws are also checked against the CPU kernels'."""
    dev = backend.device if backend is not None else "cpu"
    idx = torch.zeros(n, dtype=torch.int64, device=dev)
    s = fn(w[None].to(dev), indices=idx, seed=1234, offset=0, **kw)
    if backend is not None:
        agrees_with_cpu(backend, s, fn, w[None], indices=idx, seed=1234, offset=0, **kw)
    return s.cpu()


# ---------------------------------------------------------------------------------------------
# Randomness
# ---------------------------------------------------------------------------------------------


def test_reference_philox_known_answers():
    # Random123's published known-answer vectors for philox4x32-10
    assert ref_philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    m = 0xFFFFFFFF
    assert ref_philox4x32_10([m] * 4, [m, m]) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert ref_philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("seed,offset", [(0, 0), (42, 7), (2**63 + 5, 2**40 + 3)])
def test_kernel_stream_is_philox(backend, seed, offset):
    # Uniform weights over 256 tokens: the inverse CDF is exactly floor(u * 256), so the kernel's
    # draws must equal the reference Philox stream at counter (offset, row, 0) under key seed.
    rows = 64
    probs = torch.full((rows, 256), 1.0 / 256, device=backend.device)
    got = llmkern.sampling_from_probs(probs, seed=seed, offset=offset).cpu()
    want = [int(ref_uniform(seed, offset, i, 0) * 256) for i in range(rows)]
    assert got.tolist() == want


def test_same_seed_same_tokens_and_generator(backend):
    dev = backend.device
    w = torch.softmax(torch.randn(8, 3000), -1).to(dev)
    a = llmkern.top_k_top_p_sampling_from_probs(w, 20, 0.8, seed=3, offset=11)
    b = llmkern.top_k_top_p_sampling_from_probs(w, 20, 0.8, seed=3, offset=11)
    assert torch.equal(a, b)
    many = torch.stack([llmkern.sampling_from_probs(w, seed=3, offset=o) for o in range(8)])
    assert (many != many[0]).any()  # the offset changes the stream
    g1, g2 = torch.Generator(device=dev).manual_seed(9), torch.Generator(device=dev).manual_seed(9)
    assert torch.equal(llmkern.sampling_from_probs(w, generator=g1), llmkern.sampling_from_probs(w, generator=g2))
    torch.manual_seed(5)
    c = llmkern.sampling_from_logits(torch.randn(4, 100, device=dev))
    torch.manual_seed(5)
    assert torch.equal(c, llmkern.sampling_from_logits(torch.randn(4, 100, device=dev)))


@pytest.mark.parametrize("batch,vocab", [(1, 300000), (2, 40000), (9, 3000)])
def test_thread_count_does_not_change_results(batch, vocab):
    # batch < threads with a long row splits the row across threads; otherwise rows run in parallel.
    torch.manual_seed(1)
    logits = torch.randn(batch, vocab) * 3
    probs = torch.softmax(logits, -1)
    calls = [
        lambda: llmkern.top_k_top_p_sampling_from_logits(logits, 40, 0.9, seed=1, offset=2),
        lambda: llmkern.top_k_top_p_sampling_from_logits(logits, 40, 0.9, filter_apply_order="joint", seed=1, offset=2),
        lambda: llmkern.top_p_sampling_from_probs(probs, 0.7, seed=1, offset=2),
        lambda: llmkern.top_k_sampling_from_probs(probs, 5, seed=1, offset=2),
        lambda: llmkern.min_p_sampling_from_probs(probs, 0.3, seed=1, offset=2),
        lambda: llmkern.sampling_from_logits(logits, seed=1, offset=2),
        lambda: llmkern.top_p_renorm_probs(probs, 0.5),
        lambda: llmkern.top_k_renorm_probs(probs, 33),
        lambda: llmkern.top_k_mask_logits(logits, 33),
    ]
    before = llmkern.get_num_threads()
    try:
        llmkern.set_num_threads(1)
        one = [f() for f in calls]
        llmkern.set_num_threads(2)
        two = [f() for f in calls]
    finally:
        llmkern.set_num_threads(before)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# Exact supports (ties included) and distributions
# ---------------------------------------------------------------------------------------------

N_DRAWS = 6000


def _check_support(samples, w, keep, min_share=0.01):
    drawn = set(samples.tolist())
    allowed = set(torch.nonzero(keep).flatten().tolist())
    assert drawn <= allowed, f"drawn outside the kept set: {sorted(drawn - allowed)[:10]}"
    d = torch.where(keep, w.double(), torch.zeros_like(w.double()))
    d /= d.sum()
    # every kept token with share >= min_share is drawn (miss probability <= exp(-60) each)
    min_share = max(min_share, 60.0 / samples.numel())
    must = set(torch.nonzero(d >= min_share).flatten().tolist())
    assert must <= drawn, f"kept tokens never drawn: {sorted(must - drawn)[:10]}"


@pytest.mark.parametrize("k", [1, 5, 7, 22, 40])
def test_top_k_support_with_ties(backend, k):
    w = head_tail_row(vocab(backend))
    keep = ref_top_k_keep(w, k)
    if k == 5:  # the k-th value is tied: more than k tokens survive
        assert keep.sum() > k
    s = draws(llmkern.top_k_sampling_from_probs, w, n_draws(backend, N_DRAWS, 600), backend, top_k=k)
    _check_support(s, w, keep)


@pytest.mark.parametrize("target", [0.05, 0.2, 0.5, 0.9])
def test_top_p_support_with_ties(backend, target):
    w = head_tail_row(vocab(backend))
    p = safe_top_p(w, target)
    keep = ref_top_p_keep(w, p)
    s = draws(llmkern.top_p_sampling_from_probs, w, n_draws(backend, N_DRAWS, 600), backend, top_p=p)
    _check_support(s, w, keep, min_share=0.01)


def test_top_p_tie_at_boundary_keeps_the_whole_group(backend):
    # Sorted: 0.35, 0.25, then three tied 0.1. The mass strictly above the tied group is 0.6 < 0.65,
    # so the whole group is kept, although one of them would already reach 0.65.
    w = torch.tensor([0.35, 0.1, 0.1, 0.1, 0.25, 0.05, 0.05])
    s = draws(llmkern.top_p_sampling_from_probs, w, n_draws(backend, 3000, 600), backend, top_p=0.65)
    assert set(s.tolist()) == {0, 1, 2, 3, 4}
    assert torch.equal(ref_top_p_keep(w, 0.65), torch.tensor([1, 1, 1, 1, 1, 0, 0], dtype=torch.bool))


@pytest.mark.parametrize("min_p", [0.0, 0.3, 0.6, 1.0])
def test_min_p_support(backend, min_p):
    w = head_tail_row(vocab(backend))
    w[w.argmax()] = 2.5  # a single maximum, so min_p = 1 keeps exactly one token
    keep = ref_keep(w, min_p=min_p)
    s = draws(llmkern.min_p_sampling_from_probs, w, n_draws(backend, N_DRAWS, 600), backend, min_p=min_p)
    _check_support(s, w, keep, min_share=0.01 if min_p > 0 else 0.5)


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("k,target", [(10, 0.5), (30, 0.3), (5, 0.95)])
def test_top_k_top_p_support(backend, order, k, target):
    w = head_tail_row(vocab(backend), seed=3)
    if order == "joint":
        p = safe_top_p(w, target)
    else:
        kk = ref_top_k_keep(w, k)
        p = safe_top_p(torch.where(kk, w, torch.zeros_like(w)), target)
    keep = ref_keep(w, top_k=k, top_p=p, order=order)
    s = draws(llmkern.top_k_top_p_sampling_from_probs, w, n_draws(backend, N_DRAWS, 600), backend, top_k=k, top_p=p,
              filter_apply_order=order)
    _check_support(s, w, keep)


def dyadic_rows(rows, vocab, seed):
    """Weights m / 2^16 with m < 1024 (many ties, zeros included): every partial sum of a row is
    exact in fp32, in any order, so the CPU and CUDA kernels see identical masses."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 1024, (rows, vocab), generator=g)
    m[:, :3] = 1023  # a tied maximum
    return m.float() / 65536


def test_cuda_kernels_draw_the_cpu_kernels_tokens(backend):
    # With exact sums the two backends take the same decisions in the same order (shared pivot
    # rules, shared Philox stream), so the sampled tokens are identical, not just equidistributed.
    if backend.name == "cpu":
        pytest.skip("compares the CUDA kernels with the CPU kernels")
    dev = backend.device
    V = 1300 if backend.emulated else 20000  # fp32 partial sums stay below 2^24 units: exact
    w = dyadic_rows(6, V, seed=0)
    idx = torch.tensor([0, 1, 2, 3, 4, 5] * 20)
    top_k = torch.tensor([1, 3, 40, 200, 0, V] * 20, dtype=torch.int32)
    top_p = torch.tensor([0.3, 0.5, 0.9, 1.0, 0.7, 0.05] * 20)
    min_p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0, 0.3] * 20)
    calls = [
        (llmkern.sampling_from_probs, {}),
        (llmkern.top_k_sampling_from_probs, dict(top_k=top_k)),
        (llmkern.top_p_sampling_from_probs, dict(top_p=top_p)),
        (llmkern.min_p_sampling_from_probs, dict(min_p=min_p)),
        (llmkern.top_k_top_p_sampling_from_probs, dict(top_k=top_k, top_p=top_p)),
        (llmkern.top_k_top_p_sampling_from_probs, dict(top_k=top_k, top_p=top_p, filter_apply_order="joint")),
    ]
    for fn, kw in calls:
        args = dict(indices=idx, seed=77, offset=5, **kw)
        got = fn(w.to(dev), **{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in args.items()})
        assert torch.equal(got.cpu(), on_cpu(fn, w, **args)), fn.__name__
    k6 = torch.tensor([1, 3, 40, 200, 0, V], dtype=torch.int32)
    for fn, arg in ((llmkern.top_k_renorm_probs, k6), (llmkern.top_p_renorm_probs, top_p[:6]),
                    (llmkern.top_k_mask_logits, k6)):
        x = w - 0.004 if fn is llmkern.top_k_mask_logits else w  # signed logits, still exact
        assert torch.equal(fn(x.to(dev), arg.to(dev)).cpu(), on_cpu(fn, x, arg)), fn.__name__
    # speculative verification: residual masses are exact too
    n = 3
    q = dyadic_rows(4 * n, V, seed=1).view(4, n, V)
    p = dyadic_rows(4 * (n + 1), V, seed=2).view(4, n + 1, V)
    ids = torch.randint(0, V, (4, n))
    for draft in (q, None):
        got = llmkern.chain_speculative_sampling(draft.to(dev) if draft is not None else None, ids.to(dev), p.to(dev),
                                                 seed=3, offset=9)
        want = on_cpu(llmkern.chain_speculative_sampling, draft, ids, p, seed=3, offset=9)
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)


def test_cuda_kernels_agree_with_cpu_kernels_on_float_rows(backend):
    # General fp32/bf16 rows: the kept sets are exact on both backends; the drawn tokens agree
    # except where a rounding difference of a running sum moves a draw across a token boundary.
    if backend.name == "cpu":
        pytest.skip("compares the CUDA kernels with the CPU kernels")
    torch.manual_seed(12)
    V = 1000 if backend.emulated else 32000
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(8, V) * 3).to(dtype)
        probs = torch.softmax(logits.float(), -1).to(dtype)
        idx = torch.arange(8).repeat(25)
        for fn, x, kw in (
            (llmkern.top_k_top_p_sampling_from_logits, logits, dict(top_k=50, top_p=0.9, temperature=0.8)),
            (llmkern.top_k_top_p_sampling_from_logits, logits, dict(top_k=50, top_p=0.9, filter_apply_order="joint")),
            (llmkern.sampling_from_logits, logits, dict(temperature=1.3)),
            (llmkern.top_p_sampling_from_probs, probs, dict(top_p=0.8)),
            (llmkern.min_p_sampling_from_probs, probs, dict(min_p=0.05)),
        ):
            dev = backend.device
            got = fn(x.to(dev), indices=idx.to(dev), seed=4, offset=0, **kw)
            agrees_with_cpu(backend, got, fn, x, indices=idx, seed=4, offset=0, min_rate=0.97, **kw)


@pytest.mark.parametrize("case", ["plain", "top_k", "top_p", "min_p", "top_k_top_p", "joint"])
def test_distribution_matches_filtered_probs(backend, case):
    # simt: fewer draws (looser TV bound) plus agreement with the CPU kernels' draws
    torch.manual_seed(7)
    vocab, n = (1000, 2000) if backend.emulated else (3000, 20000)
    w = torch.softmax(torch.randn(vocab) * 2.5, -1)
    b = backend
    if case == "plain":
        s, filt = draws(llmkern.sampling_from_probs, w, n, b), {}
    elif case == "top_k":
        s, filt = draws(llmkern.top_k_sampling_from_probs, w, n, b, top_k=25), dict(top_k=25)
    elif case == "top_p":
        p = safe_top_p(w, 0.6)
        s, filt = draws(llmkern.top_p_sampling_from_probs, w, n, b, top_p=p), dict(top_p=p)
    elif case == "min_p":
        s, filt = draws(llmkern.min_p_sampling_from_probs, w, n, b, min_p=0.05), dict(min_p=0.05)
    else:
        order = "joint" if case == "joint" else "top_k_first"
        kk = ref_top_k_keep(w, 40)
        p = safe_top_p(w if order == "joint" else torch.where(kk, w, torch.zeros_like(w)), 0.7)
        s = draws(llmkern.top_k_top_p_sampling_from_probs, w, n, b, top_k=40, top_p=p, filter_apply_order=order)
        filt = dict(top_k=40, top_p=p, order=order)
    assert_follows(s, ref_filtered_probs(w, **filt))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_logits_variants_distribution_and_temperature(backend, dtype):
    torch.manual_seed(11)
    vocab, n = (1000, 1500) if backend.emulated else (2500, 16000)
    logits = (torch.randn(vocab) * 2).to(dtype)
    temp = 0.7
    s = draws(llmkern.sampling_from_logits, logits, n, backend, temperature=temp)
    ref = torch.softmax(logits.float().double() / temp, -1)  # weights come from the fp32 logits
    assert_follows(s, ref)
    kk = ref_top_k_keep(ref, 30)
    p = safe_top_p(torch.where(kk, ref, torch.zeros_like(ref)), 0.8)
    s2 = draws(llmkern.top_k_top_p_sampling_from_logits, logits, n, backend, top_k=30, top_p=p, temperature=temp)
    assert_follows(s2, ref_filtered_probs(ref, top_k=30, top_p=p, order="top_k_first"))


def test_chi_square_rejects_a_wrong_temperature():
    # The power the distribution tests rely on: draws at temperature 0.6 fail the test for 0.7
    # (statistic ~2,100 vs a critical value of ~360 here), as do draws at 0.8.
    torch.manual_seed(11)
    logits = torch.randn(2500) * 2
    ref = torch.softmax(logits.double() / 0.7, -1)
    assert follows(draws(llmkern.sampling_from_logits, logits, 16000, temperature=0.7), ref)
    for wrong in (0.6, 0.8):
        assert not follows(draws(llmkern.sampling_from_logits, logits, 16000, temperature=wrong), ref)


def test_per_row_parameters_and_greedy_rows(backend):
    torch.manual_seed(2)
    dev = backend.device
    logits = torch.randn(6, 800)
    temp = torch.tensor([0.0, 1.0, 0.5, 0.0, 2.0, 1.0])
    top_k = torch.tensor([5, 0, 800, 1, 3, 10], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.3, 1.0, 1.0])
    s = llmkern.top_k_top_p_sampling_from_logits(logits.to(dev), top_k.to(dev), top_p.to(dev),
                                                 temperature=temp.to(dev), seed=0, offset=0).cpu()
    am = logits.argmax(-1)
    assert s[0] == am[0] and s[3] == am[3]  # temperature 0: greedy whatever the filters
    assert s[5].item() in torch.topk(logits[5], 10).indices.tolist()
    assert s[4].item() in torch.topk(logits[4], 3).indices.tolist()
    probs = torch.softmax(logits, -1)
    s = llmkern.top_k_sampling_from_probs(probs.to(dev), top_k.to(dev), seed=0, offset=0).cpu()
    for i, k in enumerate(top_k.tolist()):
        assert ref_keep(probs[i], top_k=k)[s[i]]
    min_p = torch.tensor([0.9, 0.0, 0.5, 1.0, 0.2, 0.1])
    s = llmkern.min_p_sampling_from_probs(probs.to(dev), min_p.to(dev), seed=0, offset=0).cpu()
    assert s[3] == am[3]


def test_indices_and_output_dtype(backend):
    dev = backend.device
    probs = torch.softmax(torch.randn(3, 500), -1).to(dev)
    idx = torch.tensor([2, 2, 0, 1, 2], dtype=torch.int64, device=dev)
    s = llmkern.top_k_sampling_from_probs(probs, 1, indices=idx, seed=0, offset=0)
    assert s.dtype == torch.int64 and s.tolist() == probs.argmax(-1)[idx].tolist()
    s32 = llmkern.sampling_from_probs(probs, indices=idx.int(), seed=0, offset=0)
    assert s32.dtype == torch.int32 and s32.shape == (5,)
    assert llmkern.sampling_from_probs(probs).dtype == torch.int32
    empty = llmkern.sampling_from_probs(probs, indices=torch.zeros(0, dtype=torch.int64, device=dev))
    assert empty.shape == (0,)


def test_strided_and_half_probs(backend):
    dev = backend.device
    base = torch.softmax(torch.randn(4, 1200), -1).to(dev)
    wide = torch.zeros(4, 2000, device=dev)
    wide[:, :1200] = base
    view = wide[:, :1200]  # row stride 2000
    a = llmkern.top_k_sampling_from_probs(view, 3, seed=1, offset=1)
    b = llmkern.top_k_sampling_from_probs(base, 3, seed=1, offset=1)
    assert torch.equal(a, b)
    for dt in (torch.float16, torch.bfloat16):
        s = llmkern.top_k_sampling_from_probs(base.to(dt), 1, seed=1, offset=1)
        assert torch.equal(s.long(), base.to(dt).float().argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["logits_top_k", "logits_top_k_top_p", "logits_near_max", "probs_ties", "probs_top_p"])
def test_small_k_one_pass_path_matches_general_path(dtype, case):
    # On CPU, rows with k <= 1024 and 4k <= vocab take a one-pass path (small_k_cpu.h); others the
    # pivot searches. Padding a row with tokens that carry no mass (-inf logits, zero
    # probabilities) changes neither the kept set nor the draw, but moves a row from one path to
    # the other: the two must draw the same tokens (rare flips from rounding of sums allowed).
    g = torch.Generator().manual_seed(11)
    k, n = 40, 120  # 4k > n: general path; padded to 4n: one-pass path
    if case == "logits_near_max":
        # 45 distinct logits one ulp apart, all of weight exp((x - max) / T) == 1: tied at the
        # k-th weight, so all 45 are kept although only 40 logits reach the 40th largest logit.
        top = [torch.tensor(0.01)]
        for _ in range(44):
            top.append(torch.nextafter(top[-1], torch.tensor(-1.0)))
        x = torch.cat([torch.stack(top), torch.randn(n - 45, generator=g) * 0.5 - 3.0])
    elif case == "probs_ties":
        x = torch.tensor([0.05] * 12 + [0.02] * 20 + [0.001] * (n - 32))
    else:
        x = torch.randn(n, generator=g) * 2
    is_logits = case.startswith("logits")
    if not is_logits and case == "probs_top_p":
        x = torch.softmax(x, -1)
    pad = torch.full((3 * n,), -math.inf if is_logits else 0.0)
    idx = torch.zeros(2000, dtype=torch.int64)
    top_p = 0.6 if case.endswith("top_p") else 1.0
    if is_logits:
        f = lambda row: llmkern.top_k_top_p_sampling_from_logits(  # noqa: E731
            row[None].to(dtype), k, top_p, indices=idx, temperature=0.7, seed=5, offset=3)
    else:
        f = lambda row: llmkern.top_k_top_p_sampling_from_probs(  # noqa: E731
            row[None].to(dtype), k, top_p, indices=idx, seed=5, offset=3)
    short, long_ = f(x), f(torch.cat([x, pad]))
    long_shuffled = f(torch.cat([pad, x]))  # the same row behind the padding: ids shift by 3n
    assert (short == long_).double().mean() >= 0.99
    assert ((short + 3 * n) == long_shuffled).double().mean() >= 0.99
    assert len(set(short.tolist())) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unaligned_rows_match_contiguous(backend, dtype):
    # Rows starting off a 16-byte boundary take the element-load path of the CUDA kernels; the
    # weights and their partition across threads are the same, so the results are too.
    dev = backend.device
    torch.manual_seed(6)
    logits = (torch.randn(3, 1001) * 2).to(dtype).to(dev)
    view = logits[:, 1:]  # 2- or 4-byte misaligned rows of 1000
    dense = view.contiguous()
    probs_view = torch.softmax(logits.float(), -1)[:, 1:].to(dtype)
    for f in (
        lambda x: llmkern.top_k_top_p_sampling_from_logits(x, 20, 0.8, seed=2, offset=0),
        lambda x: llmkern.top_k_top_p_sampling_from_logits(x, 20, 0.8, filter_apply_order="joint", seed=2, offset=0),
        lambda x: llmkern.top_k_mask_logits(x, 7),
    ):
        assert torch.equal(f(view), f(dense))
    for f in (
        lambda x: llmkern.top_p_sampling_from_probs(x, 0.7, seed=2, offset=0),
        lambda x: llmkern.top_p_renorm_probs(x, 0.6),
        lambda x: llmkern.top_k_renorm_probs(x, 9),
    ):
        assert torch.equal(f(probs_view), f(probs_view.contiguous()))


# ---------------------------------------------------------------------------------------------
# NaN / inf / degenerate rows
# ---------------------------------------------------------------------------------------------


def test_nan_and_degenerate_rows(backend):
    dev = backend.device
    p = torch.softmax(torch.randn(4, 300), -1)
    p[0, 7] = float("nan")
    p[1] = 0.0
    p[2, 5] = float("inf")
    p[3, :] = float("nan")
    p = p.to(dev)
    with pytest.raises(ValueError, match="probs"):
        llmkern.sampling_from_probs(p, check_nan=True)
    n = n_draws(backend, 2000, 300)
    idx = torch.tensor([0] * n + [1, 2, 3], device=dev)
    s, valid = llmkern.top_p_sampling_from_probs(p, 0.9, indices=idx, seed=0, offset=0, return_valid=True)
    s, valid = s.cpu(), valid.cpu()
    assert 7 not in s[:n].tolist() and valid[:n].all()  # NaN carries no mass
    assert s[n] == 0 and not valid[n]          # all zero: argmax (first) and invalid
    assert s[n + 1] == 5 and not valid[n + 1]  # +inf: infinite mass -> argmax
    assert s[n + 2] == 0 and not valid[n + 2]  # all NaN
    logits = torch.randn(2, 100)
    logits[0, :50] = float("-inf")  # masks
    logits[1, :] = float("-inf")
    logits = logits.to(dev)
    s, valid = llmkern.sampling_from_logits(logits, seed=0, offset=0, return_valid=True)
    assert s[0] >= 50 and valid[0] and not valid[1]
    logits[0, 3] = float("nan")
    with pytest.raises(ValueError, match="logits"):
        llmkern.sampling_from_logits(logits, check_nan=True)


def test_renorm_rows_without_finite_mass_become_zeros(backend):
    # A row holding +inf (or nothing positive) has no finite mass to renormalise: all zeros, no NaN.
    dev = backend.device
    p = torch.softmax(torch.randn(4, 300), -1)
    p[1, 7] = float("inf")
    p[2] = 0.0
    p[3, 5] = float("nan")
    for fn, arg in ((llmkern.top_p_renorm_probs, 0.5), (llmkern.top_k_renorm_probs, 10)):
        for dtype in (torch.float32, torch.bfloat16):
            out = fn(p.to(dtype).to(dev), arg).cpu().float()
            assert not out.isnan().any(), fn.__name__
            assert (out[1] == 0).all() and (out[2] == 0).all(), fn.__name__
            assert abs(out[0].sum().item() - 1) < 1e-2 and abs(out[3].sum().item() - 1) < 1e-2


# ---------------------------------------------------------------------------------------------
# Renormalisation and masking: exact against the sorting reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm_and_mask_exact(backend, dtype):
    torch.manual_seed(4)
    V = vocab(backend)
    rows = [head_tail_row(V, seed=s) for s in range(3)] + [torch.softmax(torch.randn(V) * 3, -1)]
    probs = torch.stack(rows).to(dtype)
    ks = [1, 5, 21, 0]
    out = llmkern.top_k_renorm_probs(probs.to(backend.device), torch.tensor(ks, device=backend.device)).cpu()
    assert out.dtype == dtype
    for i, k in enumerate(ks):
        keep = ref_top_k_keep(probs[i].float(), k)
        ref = torch.where(keep, probs[i].double(), torch.zeros(V, dtype=torch.float64))
        ref /= ref.sum()
        assert torch.equal(out[i].float() > 0, keep)
        assert torch.allclose(out[i].double(), ref, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-7)
    logits = torch.log(probs.float()).to(dtype)
    logits[0, 3] = float("nan")
    masked = llmkern.top_k_mask_logits(logits.to(backend.device), torch.tensor(ks, device=backend.device)).cpu()
    for i, k in enumerate(ks):
        x = logits[i].float()
        finite = ~torch.isnan(x)
        if k and k < int(finite.sum()):
            kth = torch.sort(torch.where(finite, x, torch.full_like(x, float("-inf"))), descending=True).values[k - 1]
            keep = x >= kth
        else:
            keep = finite
        keep &= x > float("-inf")  # -inf entries stay -inf either way
        assert torch.equal(masked[i] > float("-inf"), keep)
        assert torch.equal(masked[i][keep], logits[i][keep])


@pytest.mark.parametrize("k", [700, 1000, 1500])
def test_top_k_exact_for_large_k(backend, k):
    # Large k on a short row (many passes for a pivot search; the CUDA kernels use radix selection)
    torch.manual_seed(14)
    V = 2000
    w = torch.softmax(torch.randn(4, V) * 2.5, -1)
    w[0, :300] = w[0, 300]  # a tied block across the boundary
    logits = torch.log(w)
    logits[1, ::5] = float("-inf")
    dev = backend.device
    out = llmkern.top_k_renorm_probs(w.to(dev), k).cpu()
    masked = llmkern.top_k_mask_logits(logits.to(dev), k).cpu()
    bad = []
    for i in range(4):
        if not torch.equal(out[i] > 0, ref_top_k_keep(w[i], k)):
            bad.append(("renorm", i))
        finite = logits[i] > float("-inf")
        kk = ref_top_k_keep(torch.where(finite, w[i], torch.zeros_like(w[i])), k)
        if not torch.equal(masked[i] > float("-inf"), kk):
            bad.append(("mask", i))
    assert not bad


def test_top_p_renorm_exact(backend):
    rows = [head_tail_row(vocab(backend), seed=s) for s in range(3)]
    probs = torch.stack(rows)
    ps = [safe_top_p(rows[0], 0.3), safe_top_p(rows[1], 0.75), 1.0]
    out = llmkern.top_p_renorm_probs(probs.to(backend.device), torch.tensor(ps, device=backend.device)).cpu()
    for i, p in enumerate(ps):
        keep = ref_top_p_keep(probs[i], p)
        assert torch.equal(out[i] > 0, keep)
        assert abs(out[i].double().sum().item() - 1.0) < 1e-5


# Large k on short rows (k a sizeable share of the vocabulary): the exact searches must still end
# on the exact k-th weight, whatever the pivots a pass draws.
V_LARGE_K = 2000


def large_k_logits(k, seed):
    """Rows of V_LARGE_K logits: a block of 41 logits tied with the k-th largest (across the
    boundary), -inf entries below the boundary; the last row has fewer finite entries than k."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(3):
        x = torch.randn(V_LARGE_K, generator=g) * (2.5 if r != 1 else 0.5)
        order = torch.argsort(x, descending=True)
        x[order[k - 21:k + 20]] = x[order[k - 1]].item()
        x[order[torch.randint(k + 30, V_LARGE_K, (60,), generator=g)]] = float("-inf")
        rows.append(x)
    x = torch.randn(V_LARGE_K, generator=g)
    x[torch.randperm(V_LARGE_K, generator=g)[: V_LARGE_K - k + 50]] = float("-inf")
    rows.append(x)
    return torch.stack(rows)


def ref_mask_keep(x, k):
    finite = x > float("-inf")
    if k <= 0 or k >= int(finite.sum()):
        return finite
    return x >= torch.sort(x, descending=True).values[k - 1]


@pytest.mark.parametrize("k", [700, 1000, 1500])
def test_large_k_renorm_and_mask_match_sorted_reference(native_backend, k):
    logits = large_k_logits(k, seed=k)
    probs = torch.softmax(logits, -1)
    assert int(ref_top_k_keep(probs[0], k).sum()) > k  # the boundary tie is kept whole
    dev = native_backend.device
    out = llmkern.top_k_renorm_probs(probs.to(dev), k).cpu()
    masked = llmkern.top_k_mask_logits(logits.to(dev), k).cpu()
    for i in range(probs.shape[0]):
        keep = ref_top_k_keep(probs[i], k)
        assert torch.equal(out[i] > 0, keep), f"row {i}: kept {int((out[i] > 0).sum())}, expected {int(keep.sum())}"
        ref = torch.where(keep, probs[i].double(), torch.zeros(V_LARGE_K, dtype=torch.float64))
        assert torch.allclose(out[i].double(), ref / ref.sum(), rtol=1e-5, atol=1e-9)
        mk = ref_mask_keep(logits[i], k)
        assert torch.equal(masked[i] > float("-inf"), mk), f"row {i}"
        assert torch.equal(masked[i][mk], logits[i][mk])


@pytest.mark.parametrize("target", [0.8, 0.95, 0.99])
def test_top_p_renorm_with_large_kept_sets(native_backend, target):
    g = torch.Generator().manual_seed(int(target * 1000))
    probs = torch.softmax(torch.randn(3, V_LARGE_K, generator=g) * torch.tensor([[0.3], [1.0], [2.0]]), -1)
    ps = [safe_top_p(probs[i], target) for i in range(3)]
    out = llmkern.top_p_renorm_probs(probs.to(native_backend.device), torch.tensor(ps).to(native_backend.device)).cpu()
    for i, p in enumerate(ps):
        keep = ref_top_p_keep(probs[i], p)
        assert torch.equal(out[i] > 0, keep), f"row {i}: kept {int((out[i] > 0).sum())}, expected {int(keep.sum())}"
        assert abs(out[i].double().sum().item() - 1.0) < 1e-5


@pytest.mark.parametrize("k", [700, 1000, 1500])
@pytest.mark.parametrize("op", ["top_k_probs", "top_k_top_p_probs", "top_k_top_p_logits", "joint_logits"])
def test_large_k_sampling_support_is_the_top_k_set(native_backend, k, op):
    logits = large_k_logits(k, seed=k + 1)[0]
    probs = torch.softmax(logits, -1)
    n = 3000
    if op == "top_k_probs":
        s = draws(llmkern.top_k_sampling_from_probs, probs, n, top_k=k)
        keep = ref_top_k_keep(probs, k)
    else:
        order = "joint" if op == "joint_logits" else "top_k_first"
        base = ref_keep(probs, top_k=k)  # top-p relative to the top-k set (top_k_first) or the row
        p = safe_top_p(torch.where(base, probs, torch.zeros_like(probs)) if order == "top_k_first" else probs, 0.98)
        fn = llmkern.top_k_top_p_sampling_from_probs if op.endswith("probs") else llmkern.top_k_top_p_sampling_from_logits
        x = probs if op.endswith("probs") else logits
        s = draws(fn, x, n, top_k=k, top_p=p, filter_apply_order=order)
        keep = ref_keep(probs, top_k=k, top_p=p, order=order)
    assert keep.sum() < (probs > 0).sum()
    _check_support(s, probs, keep)
    # the draws reach the boundary: the kept set is not narrower than the reference either
    w = torch.where(keep, probs.double(), torch.zeros(V_LARGE_K, dtype=torch.float64))
    low_half = w <= torch.quantile(w[keep], 0.5)
    share = (w * low_half).sum() / w.sum()
    hits = low_half[s].double().mean()
    assert hits > share / 3, f"lower half of the kept set drawn {hits:.4f}, its share {share:.4f}"


# ---------------------------------------------------------------------------------------------
# Penalties (vLLM semantics)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_penalties(backend, dtype):
    torch.manual_seed(8)
    b, vocab, L = 3, 400, 30
    logits = (torch.randn(b, vocab) * 3).to(dtype)
    out_ids = torch.randint(0, vocab, (b, L))
    out_ids[0, 20:] = -1
    out_ids[1, 25:] = vocab  # vLLM's padding value
    prompt_ids = torch.randint(0, vocab, (b, 12))
    prompt_ids[2, 6:] = -1
    counts = torch.zeros(b, vocab, dtype=torch.int64)
    mask = torch.zeros(b, vocab, dtype=torch.bool)
    for i in range(b):
        for t in out_ids[i].tolist():
            if 0 <= t < vocab:
                counts[i, t] += 1
        for t in prompt_ids[i].tolist():
            if t >= 0:
                mask[i, t] = True
    rep, freq, pres = torch.tensor([1.3, 0.8, 1.0]), torch.tensor([0.2, 0.0, 0.5]), torch.tensor([0.1, 0.3, 0.0])
    ref = ref_apply_penalties(logits.float(), counts, mask, rep, freq, pres).to(dtype)
    tol = dict(atol=0, rtol=0) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    dev = backend.device
    logits, out_ids, prompt_ids, counts, mask = (t.to(dev) for t in (logits, out_ids, prompt_ids, counts, mask))
    rep, freq, pres = rep.to(dev), freq.to(dev), pres.to(dev)
    a = llmkern.apply_penalties(logits.clone(), counts, rep, freq, pres, prompt_mask=mask).cpu()
    torch.testing.assert_close(a, ref, **tol)
    c = llmkern.apply_penalties(logits.clone(), None, rep, freq, pres, output_token_ids=out_ids,
                                prompt_token_ids=prompt_ids).cpu()
    torch.testing.assert_close(c, ref, **tol)
    d = llmkern.apply_penalties(logits.clone(), counts.int(), rep, freq, pres, prompt_token_ids=prompt_ids).cpu()
    torch.testing.assert_close(d, ref, **tol)
    f = llmkern.apply_penalties(logits.clone(), None, rep, freq, pres, output_token_ids=out_ids.int(),
                                prompt_mask=mask).cpu()
    torch.testing.assert_close(f, ref, **tol)
    e = llmkern.apply_penalties(logits.clone(), counts, 1.2, 0.1, 0.2).cpu()
    counts, mask = counts.cpu(), mask.cpu()
    ref_e = ref_apply_penalties(logits.float(), counts, torch.zeros_like(mask), torch.full((b,), 1.2),
                                torch.full((b,), 0.1), torch.full((b,), 0.2)).to(dtype)
    torch.testing.assert_close(e, ref_e, **tol)


@pytest.mark.parametrize("lengths", [(3000, 1500), (20000, 13000)])
def test_apply_penalties_long_id_lists(backend, lengths):
    # Long token-id lists: the CUDA kernel sorts up to 32768 ids of a row in shared memory (over
    # 48 KiB here: the opt-in path) and walks longer lists directly in global memory.
    L, Lp = lengths
    torch.manual_seed(9)
    b, vocab = 2, 300
    logits = torch.randn(b, vocab) * 3
    out_ids = torch.randint(0, 40, (b, L))  # few distinct tokens, many repeats
    out_ids[0, ::7] = -1
    prompt_ids = torch.randint(20, 120, (b, Lp))
    prompt_ids[1, -100:] = vocab
    counts = torch.zeros(b, vocab, dtype=torch.int64)
    mask = torch.zeros(b, vocab, dtype=torch.bool)
    for i in range(b):
        o = out_ids[i][(out_ids[i] >= 0) & (out_ids[i] < vocab)]
        counts[i] += torch.bincount(o, minlength=vocab)
        mask[i, prompt_ids[i][prompt_ids[i] < vocab]] = True
    rep, freq, pres = torch.tensor([1.5, 0.7]), torch.tensor([0.01, 0.02]), torch.tensor([0.3, 0.0])
    ref = ref_apply_penalties(logits, counts, mask, rep, freq, pres)
    dev = backend.device
    got = llmkern.apply_penalties(logits.to(dev), None, rep.to(dev), freq.to(dev), pres.to(dev),
                                  output_token_ids=out_ids.to(dev), prompt_token_ids=prompt_ids.to(dev)).cpu()
    torch.testing.assert_close(got, ref)  # fp32 rounding of x - freq * count (FMA or not)


# ---------------------------------------------------------------------------------------------
# torch.library registration: opcheck and torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def _sampler_args(x, is_logits, **over):
    args = dict(temperature_arr=None, temperature_val=1.0, top_k_arr=None, top_k_val=5, top_p_arr=None,
                top_p_val=0.9, min_p_arr=None, min_p_val=0.0, filter_apply_order="joint", seed_arr=None,
                seed_val=3, offset_arr=None, offset_val=0)
    args.update(over)
    return (x, is_logits, None, *args.values())


def test_opcheck(native_backend):
    dev = native_backend.device
    probs = torch.softmax(torch.randn(3, 64, device=dev), -1)
    logits = torch.randn(3, 64, device=dev)
    ops = llmkern.ops
    torch.library.opcheck(ops.top_k_top_p_sampling_from_probs.op, _sampler_args(probs, False))
    torch.library.opcheck(ops.top_k_top_p_sampling_from_logits.op,
                          _sampler_args(logits, True, temperature_arr=torch.tensor([0.5, 0.0, 1.0], device=dev)))
    torch.library.opcheck(ops.sampling_from_probs.op,
                          (probs, False, torch.tensor([0, 2], device=dev), None, 1.0, None, 0, None, 1.0, None, 0.0,
                           "joint", torch.tensor([7], device=dev), 0, torch.tensor([1], device=dev), 0))
    torch.library.opcheck(ops.top_p_renorm_probs.op, (probs, None, 0.5))
    torch.library.opcheck(ops.top_k_renorm_probs.op, (probs, torch.tensor([1, 2, 3], device=dev), 0.0))
    torch.library.opcheck(ops.top_k_mask_logits.op, (logits, None, 4.0))
    tp = torch.softmax(torch.randn(2, 3, 64, device=dev), -1)
    dp = torch.softmax(torch.randn(2, 2, 64, device=dev), -1)
    ids = torch.randint(0, 64, (2, 2), dtype=torch.int32, device=dev)
    zeros = lambda: torch.zeros(2, dtype=torch.int32, device=dev)  # noqa: E731
    torch.library.opcheck(ops.chain_speculative_sampling.op, (dp, ids, tp, zeros(), zeros(), None, 1, None, 2))
    torch.library.opcheck(ops.apply_penalties.op,
                          (logits.clone(), torch.randint(0, 3, (3, 64), device=dev), None, None, None, None, 1.2,
                           None, 0.1, None, 0.1))


def test_torch_compile_fullgraph(native_backend):
    dev = native_backend.device
    logits = torch.randn(4, 256, device=dev)

    def step(x, seed):
        x = llmkern.apply_penalties(x.clone(), None, 1.1, 0.0, 0.0,
                                    output_token_ids=torch.zeros(4, 2, dtype=torch.int64, device=x.device))
        a = llmkern.top_k_top_p_sampling_from_logits(x, 20, 0.9, seed=seed, offset=0, temperature=0.8)
        b = llmkern.top_k_mask_logits(x, 5)
        c = llmkern.top_p_renorm_probs(torch.softmax(x, -1), 0.5)
        return a, b, c

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for x, y in zip(compiled(logits, 3), step(logits, 3)):
        assert torch.equal(x, y)


# ---------------------------------------------------------------------------------------------
# CUDA graphs: a sampling step (penalties, mask, renorm, sampling, verification) captured and
# replayed; seed/offset live in device tensors, so replays advance the stream without host work
# ---------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_graph_sampling_step():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = "cuda"
    torch.manual_seed(13)
    b, V, n = 4, 32000, 3
    logits = torch.randn(b, V, device=dev) * 3
    out_ids = torch.randint(0, V, (b, 50), device=dev)
    seed = torch.tensor([1234], dtype=torch.int64, device=dev)
    offset = torch.tensor([0], dtype=torch.int64, device=dev)
    draft = torch.softmax(torch.randn(b, n, V, device=dev), -1)
    target = torch.softmax(torch.randn(b, n + 1, V, device=dev), -1)
    ids = torch.randint(0, V, (b, n), device=dev)

    def step():
        x = llmkern.apply_penalties(logits.clone(), None, 1.2, 0.1, 0.1, output_token_ids=out_ids)
        masked = llmkern.top_k_mask_logits(x, 40)
        probs = llmkern.top_p_renorm_probs(torch.softmax(x, -1), 0.9)
        tok = llmkern.top_k_top_p_sampling_from_logits(x, 40, 0.9, seed=seed, offset=offset, temperature=0.8)
        tok2 = llmkern.top_p_sampling_from_probs(probs, 0.5, seed=seed, offset=offset)
        spec = llmkern.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)[0]
        return masked, probs, tok, tok2, spec

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for off in (0, 7, 8):
        offset.fill_(off)
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for a, e in zip(captured, eager):
            assert torch.equal(a, e)
