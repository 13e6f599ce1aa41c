"""Sampling ops: exact supports against a sorting reference (ties included), distributions with
fixed seeds and non-flaky bounds, the Philox stream, reproducibility across thread counts,
renormalisation / masking, penalties, NaN handling, torch.library registration."""
import math

import pytest
import torch

import llmkern
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


def tv_bound(support: int, n: int, fail_log: float = 40.0) -> float:
    """A total-variation bound the empirical distribution of n draws exceeds with probability
    below exp(-fail_log): E[TV] <= 0.5 * sqrt(support / n), plus McDiarmid's deviation
    sqrt(fail_log / (2n)) (TV changes by at most 1/n per draw)."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(fail_log / (2 * n))


def empirical(samples, vocab):
    return torch.bincount(samples.long(), minlength=vocab).double() / samples.numel()


def tv(p, q):
    return 0.5 * (p - q).abs().sum().item()


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


def draws(fn, w, n, **kw):
    """n draws from the same row through `indices` (each output row has its own random stream)."""
    idx = torch.zeros(n, dtype=torch.int64)
    return fn(w[None], indices=idx, seed=1234, offset=0, **kw)


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
def test_kernel_stream_is_philox(seed, offset):
    # Uniform weights over 256 tokens: the inverse CDF is exactly floor(u * 256), so the kernel's
    # draws must equal the reference Philox stream at counter (offset, row, 0) under key seed.
    rows = 64
    probs = torch.full((rows, 256), 1.0 / 256)
    got = llmkern.sampling_from_probs(probs, seed=seed, offset=offset)
    want = [int(ref_uniform(seed, offset, i, 0) * 256) for i in range(rows)]
    assert got.tolist() == want


def test_same_seed_same_tokens_and_generator():
    w = torch.softmax(torch.randn(8, 3000), -1)
    a = llmkern.top_k_top_p_sampling_from_probs(w, 20, 0.8, seed=3, offset=11)
    b = llmkern.top_k_top_p_sampling_from_probs(w, 20, 0.8, seed=3, offset=11)
    assert torch.equal(a, b)
    many = torch.stack([llmkern.sampling_from_probs(w, seed=3, offset=o) for o in range(8)])
    assert (many != many[0]).any()  # the offset changes the stream
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(llmkern.sampling_from_probs(w, generator=g1), llmkern.sampling_from_probs(w, generator=g2))
    torch.manual_seed(5)
    c = llmkern.sampling_from_logits(torch.randn(4, 100))
    torch.manual_seed(5)
    assert torch.equal(c, llmkern.sampling_from_logits(torch.randn(4, 100)))


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
    must = set(torch.nonzero(d >= min_share).flatten().tolist())
    assert must <= drawn, f"kept tokens never drawn: {sorted(must - drawn)[:10]}"


@pytest.mark.parametrize("k", [1, 5, 7, 22, 40])
def test_top_k_support_with_ties(k):
    w = head_tail_row()
    keep = ref_top_k_keep(w, k)
    if k == 5:  # the k-th value is tied: more than k tokens survive
        assert keep.sum() > k
    s = draws(llmkern.top_k_sampling_from_probs, w, N_DRAWS, top_k=k)
    _check_support(s, w, keep)


@pytest.mark.parametrize("target", [0.05, 0.2, 0.5, 0.9])
def test_top_p_support_with_ties(target):
    w = head_tail_row()
    p = safe_top_p(w, target)
    keep = ref_top_p_keep(w, p)
    s = draws(llmkern.top_p_sampling_from_probs, w, N_DRAWS, top_p=p)
    _check_support(s, w, keep, min_share=0.01)


def test_top_p_tie_at_boundary_keeps_the_whole_group():
    # Sorted: 0.35, 0.25, then three tied 0.1. The mass strictly above the tied group is 0.6 < 0.65,
    # so the whole group is kept, although one of them would already reach 0.65.
    w = torch.tensor([0.35, 0.1, 0.1, 0.1, 0.25, 0.05, 0.05])
    s = draws(llmkern.top_p_sampling_from_probs, w, 3000, top_p=0.65)
    assert set(s.tolist()) == {0, 1, 2, 3, 4}
    assert torch.equal(ref_top_p_keep(w, 0.65), torch.tensor([1, 1, 1, 1, 1, 0, 0], dtype=torch.bool))


@pytest.mark.parametrize("min_p", [0.0, 0.3, 0.6, 1.0])
def test_min_p_support(min_p):
    w = head_tail_row()
    w[w.argmax()] = 2.5  # a single maximum, so min_p = 1 keeps exactly one token
    keep = ref_keep(w, min_p=min_p)
    s = draws(llmkern.min_p_sampling_from_probs, w, N_DRAWS, min_p=min_p)
    _check_support(s, w, keep, min_share=0.01 if min_p > 0 else 0.5)


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("k,target", [(10, 0.5), (30, 0.3), (5, 0.95)])
def test_top_k_top_p_support(order, k, target):
    w = head_tail_row(seed=3)
    if order == "joint":
        p = safe_top_p(w, target)
    else:
        kk = ref_top_k_keep(w, k)
        p = safe_top_p(torch.where(kk, w, torch.zeros_like(w)), target)
    keep = ref_keep(w, top_k=k, top_p=p, order=order)
    s = draws(llmkern.top_k_top_p_sampling_from_probs, w, N_DRAWS, top_k=k, top_p=p, filter_apply_order=order)
    _check_support(s, w, keep)


@pytest.mark.parametrize("case", ["plain", "top_k", "top_p", "min_p", "top_k_top_p", "joint"])
def test_distribution_matches_filtered_probs(case):
    torch.manual_seed(7)
    vocab, n = 3000, 20000
    w = torch.softmax(torch.randn(vocab) * 2.5, -1)
    if case == "plain":
        s, filt = draws(llmkern.sampling_from_probs, w, n), {}
    elif case == "top_k":
        s, filt = draws(llmkern.top_k_sampling_from_probs, w, n, top_k=25), dict(top_k=25)
    elif case == "top_p":
        p = safe_top_p(w, 0.6)
        s, filt = draws(llmkern.top_p_sampling_from_probs, w, n, top_p=p), dict(top_p=p)
    elif case == "min_p":
        s, filt = draws(llmkern.min_p_sampling_from_probs, w, n, min_p=0.05), dict(min_p=0.05)
    else:
        order = "joint" if case == "joint" else "top_k_first"
        kk = ref_top_k_keep(w, 40)
        p = safe_top_p(w if order == "joint" else torch.where(kk, w, torch.zeros_like(w)), 0.7)
        s = draws(llmkern.top_k_top_p_sampling_from_probs, w, n, top_k=40, top_p=p, filter_apply_order=order)
        filt = dict(top_k=40, top_p=p, order=order)
    ref = ref_filtered_probs(w, **filt)
    support = int((ref > 0).sum())
    assert tv(empirical(s, vocab), ref) < tv_bound(support, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_logits_variants_distribution_and_temperature(dtype):
    torch.manual_seed(11)
    vocab, n = 2500, 16000
    logits = (torch.randn(vocab) * 2).to(dtype)
    idx = torch.zeros(n, dtype=torch.int64)
    temp = 0.7
    s = llmkern.sampling_from_logits(logits[None], indices=idx, temperature=temp, seed=5, offset=1)
    ref = torch.softmax(logits.double() / temp, -1)
    # The bound covers the sampling noise; weights are computed from the fp32 logits
    assert tv(empirical(s, vocab), ref) < tv_bound(vocab, n)
    kk = ref_top_k_keep(ref, 30)
    p = safe_top_p(torch.where(kk, ref, torch.zeros_like(ref)), 0.8)
    s2 = llmkern.top_k_top_p_sampling_from_logits(logits[None], 30, p, indices=idx, temperature=temp, seed=5, offset=1)
    ref2 = ref_filtered_probs(ref, top_k=30, top_p=p, order="top_k_first")
    assert set(s2.tolist()) <= set(torch.nonzero(ref2).flatten().tolist())
    assert tv(empirical(s2, vocab), ref2) < tv_bound(int((ref2 > 0).sum()), n)


def test_per_row_parameters_and_greedy_rows():
    torch.manual_seed(2)
    logits = torch.randn(6, 800)
    temp = torch.tensor([0.0, 1.0, 0.5, 0.0, 2.0, 1.0])
    top_k = torch.tensor([5, 0, 800, 1, 3, 10], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.3, 1.0, 1.0])
    s = llmkern.top_k_top_p_sampling_from_logits(logits, top_k, top_p, temperature=temp, seed=0, offset=0)
    am = logits.argmax(-1)
    assert s[0] == am[0] and s[3] == am[3]  # temperature 0: greedy whatever the filters
    assert s[5].item() in torch.topk(logits[5], 10).indices.tolist()
    assert s[4].item() in torch.topk(logits[4], 3).indices.tolist()
    probs = torch.softmax(logits, -1)
    s = llmkern.top_k_sampling_from_probs(probs, top_k, seed=0, offset=0)
    for i, k in enumerate(top_k.tolist()):
        assert ref_keep(probs[i], top_k=k)[s[i]]
    s = llmkern.min_p_sampling_from_probs(probs, torch.tensor([0.9, 0.0, 0.5, 1.0, 0.2, 0.1]), seed=0, offset=0)
    assert s[3] == am[3]


def test_indices_and_output_dtype():
    probs = torch.softmax(torch.randn(3, 500), -1)
    idx = torch.tensor([2, 2, 0, 1, 2], dtype=torch.int64)
    s = llmkern.top_k_sampling_from_probs(probs, 1, indices=idx, seed=0, offset=0)
    assert s.dtype == torch.int64 and s.tolist() == probs.argmax(-1)[idx].tolist()
    s32 = llmkern.sampling_from_probs(probs, indices=idx.int(), seed=0, offset=0)
    assert s32.dtype == torch.int32 and s32.shape == (5,)
    assert llmkern.sampling_from_probs(probs).dtype == torch.int32
    empty = llmkern.sampling_from_probs(probs, indices=torch.zeros(0, dtype=torch.int64))
    assert empty.shape == (0,)


def test_strided_and_half_probs():
    base = torch.softmax(torch.randn(4, 1200), -1)
    wide = torch.zeros(4, 2000)
    wide[:, :1200] = base
    view = wide[:, :1200]  # row stride 2000
    a = llmkern.top_k_sampling_from_probs(view, 3, seed=1, offset=1)
    b = llmkern.top_k_sampling_from_probs(base, 3, seed=1, offset=1)
    assert torch.equal(a, b)
    for dt in (torch.float16, torch.bfloat16):
        s = llmkern.top_k_sampling_from_probs(base.to(dt), 1, seed=1, offset=1)
        assert torch.equal(s.long(), base.to(dt).float().argmax(-1))


# ---------------------------------------------------------------------------------------------
# NaN / inf / degenerate rows
# ---------------------------------------------------------------------------------------------


def test_nan_and_degenerate_rows():
    p = torch.softmax(torch.randn(4, 300), -1)
    p[0, 7] = float("nan")
    p[1] = 0.0
    p[2, 5] = float("inf")
    p[3, :] = float("nan")
    with pytest.raises(ValueError, match="probs"):
        llmkern.sampling_from_probs(p, check_nan=True)
    idx = torch.tensor([0] * 2000 + [1, 2, 3])
    s, valid = llmkern.top_p_sampling_from_probs(p, 0.9, indices=idx, seed=0, offset=0, return_valid=True)
    assert 7 not in s[:2000].tolist() and valid[:2000].all()  # NaN carries no mass
    assert s[2000] == 0 and not valid[2000]     # all zero: argmax (first) and invalid
    assert s[2001] == 5 and not valid[2001]     # +inf: infinite mass -> argmax
    assert s[2002] == 0 and not valid[2002]     # all NaN
    logits = torch.randn(2, 100)
    logits[0, :50] = float("-inf")  # masks
    logits[1, :] = float("-inf")
    s, valid = llmkern.sampling_from_logits(logits, seed=0, offset=0, return_valid=True)
    assert s[0] >= 50 and valid[0] and not valid[1]
    logits[0, 3] = float("nan")
    with pytest.raises(ValueError, match="logits"):
        llmkern.sampling_from_logits(logits, check_nan=True)


# ---------------------------------------------------------------------------------------------
# Renormalisation and masking: exact against the sorting reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm_and_mask_exact(dtype):
    torch.manual_seed(4)
    rows = [head_tail_row(seed=s) for s in range(3)] + [torch.softmax(torch.randn(V_BIG) * 3, -1)]
    probs = torch.stack(rows).to(dtype)
    ks = [1, 5, 21, 0]
    out = llmkern.top_k_renorm_probs(probs, torch.tensor(ks))
    assert out.dtype == dtype
    for i, k in enumerate(ks):
        keep = ref_top_k_keep(probs[i].float(), k)
        ref = torch.where(keep, probs[i].double(), torch.zeros(V_BIG, dtype=torch.float64))
        ref /= ref.sum()
        assert torch.equal(out[i].float() > 0, keep)
        assert torch.allclose(out[i].double(), ref, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-7)
    logits = torch.log(probs.float()).to(dtype)
    logits[0, 3] = float("nan")
    masked = llmkern.top_k_mask_logits(logits, torch.tensor(ks))
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


def test_top_p_renorm_exact():
    rows = [head_tail_row(seed=s) for s in range(3)]
    probs = torch.stack(rows)
    ps = [safe_top_p(rows[0], 0.3), safe_top_p(rows[1], 0.75), 1.0]
    out = llmkern.top_p_renorm_probs(probs, torch.tensor(ps))
    for i, p in enumerate(ps):
        keep = ref_top_p_keep(probs[i], p)
        assert torch.equal(out[i] > 0, keep)
        assert abs(out[i].double().sum().item() - 1.0) < 1e-5


# ---------------------------------------------------------------------------------------------
# Penalties (vLLM semantics)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_penalties(dtype):
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
    a = llmkern.apply_penalties(logits.clone(), counts, rep, freq, pres, prompt_mask=mask)
    torch.testing.assert_close(a, ref, **tol)
    c = llmkern.apply_penalties(logits.clone(), None, rep, freq, pres, output_token_ids=out_ids,
                                prompt_token_ids=prompt_ids)
    torch.testing.assert_close(c, ref, **tol)
    d = llmkern.apply_penalties(logits.clone(), counts.int(), rep, freq, pres, prompt_token_ids=prompt_ids)
    torch.testing.assert_close(d, ref, **tol)
    e = llmkern.apply_penalties(logits.clone(), counts, 1.2, 0.1, 0.2)
    ref_e = ref_apply_penalties(logits.float(), counts, torch.zeros_like(mask), torch.full((b,), 1.2),
                                torch.full((b,), 0.1), torch.full((b,), 0.2)).to(dtype)
    torch.testing.assert_close(e, ref_e, **tol)


# ---------------------------------------------------------------------------------------------
# torch.library registration: opcheck and torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def _sampler_args(x, is_logits, **over):
    args = dict(temperature_arr=None, temperature_val=1.0, top_k_arr=None, top_k_val=5, top_p_arr=None,
                top_p_val=0.9, min_p_arr=None, min_p_val=0.0, filter_apply_order="joint", seed_arr=None,
                seed_val=3, offset_arr=None, offset_val=0)
    args.update(over)
    return (x, is_logits, None, *args.values())


def test_opcheck():
    probs = torch.softmax(torch.randn(3, 64), -1)
    logits = torch.randn(3, 64)
    ops = llmkern.ops
    torch.library.opcheck(ops.top_k_top_p_sampling_from_probs.op, _sampler_args(probs, False))
    torch.library.opcheck(ops.top_k_top_p_sampling_from_logits.op,
                          _sampler_args(logits, True, temperature_arr=torch.tensor([0.5, 0.0, 1.0])))
    torch.library.opcheck(ops.sampling_from_probs.op,
                          (probs, False, torch.tensor([0, 2]), None, 1.0, None, 0, None, 1.0, None, 0.0, "joint",
                           torch.tensor([7]), 0, torch.tensor([1]), 0))
    torch.library.opcheck(ops.top_p_renorm_probs.op, (probs, None, 0.5))
    torch.library.opcheck(ops.top_k_renorm_probs.op, (probs, torch.tensor([1, 2, 3]), 0.0))
    torch.library.opcheck(ops.top_k_mask_logits.op, (logits, None, 4.0))
    tp = torch.softmax(torch.randn(2, 3, 64), -1)
    dp = torch.softmax(torch.randn(2, 2, 64), -1)
    ids = torch.randint(0, 64, (2, 2), dtype=torch.int32)
    torch.library.opcheck(ops.chain_speculative_sampling.op,
                          (dp, ids, tp, torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                           None, 1, None, 2))
    torch.library.opcheck(ops.apply_penalties.op,
                          (logits.clone(), torch.randint(0, 3, (3, 64)), None, None, None, None, 1.2, None, 0.1,
                           None, 0.1))


def test_torch_compile_fullgraph():
    logits = torch.randn(4, 256)

    def step(x, seed):
        x = llmkern.apply_penalties(x.clone(), None, 1.1, 0.0, 0.0, output_token_ids=torch.zeros(4, 2, dtype=torch.int64))
        a = llmkern.top_k_top_p_sampling_from_logits(x, 20, 0.9, seed=seed, offset=0, temperature=0.8)
        b = llmkern.top_k_mask_logits(x, 5)
        c = llmkern.top_p_renorm_probs(torch.softmax(x, -1), 0.5)
        return a, b, c

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for x, y in zip(compiled(logits, 3), step(logits, 3)):
        assert torch.equal(x, y)
