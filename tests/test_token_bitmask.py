"""Token bitmasks (grammar masks, xgrammar's packed layout): the samplers' ``token_bitmask``
keyword (applied inside the kernels), apply_token_bitmask_inplace against plain torch and
xgrammar, and chain speculative sampling with per-position masks. Kernels run on every backend
(cpu, simt = the CUDA sources on the emulator)."""
import pytest
import torch

import llmkern
from goodness_of_fit import assert_follows
from reference import ref_filtered_probs

V_CPU, V_EMU = 5000, 1500  # > one 2048-element CPU block / several chunks of a CTA pass


def pack(allowed: torch.Tensor, words: int = 0) -> torch.Tensor:
    """bool [B, V] -> int32 [B, words] (bit j % 32 of word j // 32: token j allowed)."""
    B, V = allowed.shape
    W = max(words, (V + 31) // 32)
    bits = torch.zeros(B, W * 32, dtype=torch.int64)
    bits[:, :V] = allowed.long().cpu()
    w = (bits.view(B, W, 32) << torch.arange(32)).sum(-1)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def unpack(mask: torch.Tensor, V: int) -> torch.Tensor:
    bits = (mask.long().unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.reshape(mask.shape[0], -1)[:, :V].bool()


def ref_apply(logits, bitmask, indices=None, vocab_size=None):
    """xgrammar's semantics in plain torch (on a copy)."""
    out = logits.clone()
    V = logits.shape[-1]
    n = min(V, 32 * bitmask.shape[-1]) if vocab_size is None else vocab_size
    rows = range(logits.shape[0]) if indices is None else list(indices)
    for r in rows:
        keep = unpack(bitmask[r:r + 1].cpu(), n)[0].to(logits.device)
        out[r, :n] = torch.where(keep, logits[r, :n], torch.full_like(logits[r, :n], float("-inf")))
    return out


def random_allowed(V, frac, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(V, generator=g) < frac
    a[int(torch.randint(0, V, (1,), generator=g))] = True
    return a


def vocab(backend):
    return V_EMU if backend.emulated else V_CPU


def draws(fn, x, mask, n, dev, **kw):
    """n draws from row x through `indices`; the bitmask is per output row (all the same here)."""
    idx = torch.zeros(n, dtype=torch.int64, device=dev)
    m = pack(mask[None]).expand(n, -1).contiguous().to(dev)
    return fn(x[None].to(dev), indices=idx, seed=77, offset=0, token_bitmask=m, **kw).cpu()


# ---------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------

CASES = ["probs", "logits", "top_k", "top_p", "min_p", "top_k_top_p_logits", "top_k_top_p_probs"]


@pytest.mark.parametrize("case", CASES)
def test_masked_draws_follow_the_renormalised_distribution(backend, case):
    torch.manual_seed(3)
    V = vocab(backend)
    n = 1500 if backend.emulated else 12000
    logits = torch.randn(V) * 2
    allowed = random_allowed(V, 0.3, 5)
    w = torch.softmax(logits.double(), -1)
    masked = torch.where(allowed, w, torch.zeros_like(w))  # the mask acts before every filter
    dev = backend.device
    probs = torch.softmax(logits, -1)
    ops = llmkern
    if case == "probs":
        s, filt = draws(ops.sampling_from_probs, probs, allowed, n, dev), {}
    elif case == "logits":
        s, filt = draws(ops.sampling_from_logits, logits, allowed, n, dev), {}
    elif case == "top_k":
        s, filt = draws(ops.top_k_sampling_from_probs, probs, allowed, n, dev, top_k=20), dict(top_k=20)
    elif case == "top_p":
        s, filt = draws(ops.top_p_sampling_from_probs, probs, allowed, n, dev, top_p=0.5), dict(top_p=0.5)
    elif case == "min_p":
        s, filt = draws(ops.min_p_sampling_from_probs, probs, allowed, n, dev, min_p=0.1), dict(min_p=0.1)
    elif case == "top_k_top_p_logits":
        s = draws(ops.top_k_top_p_sampling_from_logits, logits, allowed, n, dev, top_k=30, top_p=0.7)
        filt = dict(top_k=30, top_p=0.7, order="top_k_first")
    else:
        s = draws(ops.top_k_top_p_sampling_from_probs, probs, allowed, n, dev, top_k=30, top_p=0.7,
                  filter_apply_order="joint")
        filt = dict(top_k=30, top_p=0.7, order="joint")
    assert allowed[s.long()].all(), "a disallowed token was drawn"
    assert_follows(s, ref_filtered_probs(masked, **filt))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_picks_the_best_allowed_token(backend, dtype):
    torch.manual_seed(1)
    B, V = 6, vocab(backend)
    logits = torch.randn(B, V).to(dtype)
    allowed = torch.rand(B, V) < 0.1
    allowed[:, 0] = True
    got = llmkern.sampling_from_logits(logits.to(backend.device), temperature=0.0,
                                       token_bitmask=pack(allowed).to(backend.device)).cpu()
    want = torch.where(allowed, logits.float(), torch.tensor(float("-inf"))).argmax(-1)
    assert got.tolist() == want.tolist()


def test_indices_use_the_output_rows_mask(backend):
    # two outputs sample the same input row under different masks
    dev = backend.device
    V = 300
    logits = torch.randn(1, V)
    a = torch.zeros(2, V, dtype=torch.bool)
    a[0, 7], a[1, 250] = True, True
    got = llmkern.sampling_from_logits(logits.to(dev), indices=torch.tensor([0, 0], device=dev),
                                       token_bitmask=pack(a).to(dev), seed=1, offset=0)
    assert got.cpu().tolist() == [7, 250]


def test_empty_mask_row_is_invalid_and_others_unaffected(backend):
    dev = backend.device
    V = 1000
    logits = torch.randn(3, V)
    allowed = torch.ones(3, V, dtype=torch.bool)
    allowed[1] = False
    m = pack(allowed).to(dev)
    for fn, kw in [(llmkern.sampling_from_logits, {}), (llmkern.sampling_from_logits, dict(temperature=0.0)),
                   (llmkern.top_k_top_p_sampling_from_logits, dict(top_k=5, top_p=0.9))]:
        args = (logits.to(dev),)
        if fn is not llmkern.sampling_from_logits:
            args += (kw.pop("top_k"), kw.pop("top_p"))
        _, valid = fn(*args, seed=0, offset=0, token_bitmask=m, return_valid=True, **kw)
        assert valid.cpu().tolist() == [True, False, True]
    _, valid = llmkern.sampling_from_probs(torch.softmax(logits, -1).to(dev), token_bitmask=m, return_valid=True)
    assert valid.cpu().tolist() == [True, False, True]


SAME_DRAW_CASES = [
    ("sampling_from_logits", dict()), ("sampling_from_logits", dict(temperature=0.0)),
    ("sampling_from_logits", dict(temperature=0.8)),
    ("top_k_top_p_sampling_from_logits", dict(top_k=20, top_p=0.9)),  # CPU: the one-pass small-k path
    ("top_k_top_p_sampling_from_logits", dict(top_k=2000, top_p=0.8, filter_apply_order="joint")),
    ("sampling_from_probs", dict()), ("top_k_sampling_from_probs", dict(top_k=10)),
    ("top_p_sampling_from_probs", dict(top_p=0.7)), ("min_p_sampling_from_probs", dict(min_p=0.05)),
]


@pytest.mark.parametrize("name,kw", SAME_DRAW_CASES)
def test_fused_mask_draws_what_masking_first_draws(backend, name, kw):
    # The kernels read a disallowed token as a -inf logit / zero probability: the same floats as
    # masking the input first, hence the same tokens for the same seed.
    dev = backend.device
    torch.manual_seed(8)
    B, V = 16, 3000
    logits = torch.randn(B, V) * 2
    allowed = torch.rand(B, V) < 0.3
    allowed[:, 11] = True
    m = pack(allowed)
    fn = getattr(llmkern, name)
    if "probs" in name:
        x = torch.softmax(logits, -1)
        pre = torch.where(allowed, x, torch.zeros_like(x))
    else:
        x, pre = logits, ref_apply(logits, m)
    full = torch.full_like(m, -1)
    a = fn(pre.to(dev), seed=4, offset=2, **kw).cpu()
    b = fn(x.to(dev), seed=4, offset=2, token_bitmask=m.to(dev), **kw).cpu()
    assert torch.equal(a, b)
    assert allowed.gather(1, b.long()[:, None]).all()
    c = fn(x.to(dev), seed=4, offset=2, **kw).cpu()
    d = fn(x.to(dev), seed=4, offset=2, token_bitmask=full.to(dev), **kw).cpu()
    assert torch.equal(c, d)


def test_softmax_with_mask_is_the_masked_softmax(backend):
    dev = backend.device
    x = torch.randn(4, 777)
    allowed = torch.rand(4, 777) < 0.2
    got = llmkern.softmax(x.to(dev), 0.7, token_bitmask=pack(allowed).to(dev)).cpu()
    want = torch.softmax(torch.where(allowed, x, torch.tensor(float("-inf"))).double() / 0.7, -1)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# apply_token_bitmask_inplace
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("V", [31, 49152, 49153])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_apply_bitmask_matches_torch(backend, V, dtype):
    if backend.emulated and V > 1000 and dtype != torch.float32:
        pytest.skip("one dtype of the long rows is enough on the emulator")
    torch.manual_seed(V)
    B = 3
    logits = torch.randn(B, V).to(dtype)
    m = torch.randint(-2**31, 2**31 - 1, (B, (V + 31) // 32), dtype=torch.int32)
    m[0, :] = -1  # every token allowed
    for kw in [dict(), dict(indices=[2, 0]), dict(vocab_size=V - 1)]:
        got = logits.clone().to(backend.device)
        llmkern.ops.apply_token_bitmask_inplace(got, m.to(backend.device), **kw)
        assert torch.equal(got.cpu(), ref_apply(logits, m, **kw))


def test_apply_bitmask_xgrammar_semantics(backend):
    dev = backend.device
    # bitmask narrower than the logits: the uncovered tail is left as it is
    x = torch.zeros(2, 40)
    got = x.clone().to(dev)
    llmkern.ops.apply_token_bitmask_inplace(got, torch.zeros(2, 1, dtype=torch.int32, device=dev))
    assert torch.isinf(got[:, :32]).all() and (got[:, 32:] == 0).all()
    # 1-D logits and bitmask; indices into batches of different sizes
    y = torch.zeros(40, device=dev)
    llmkern.ops.apply_token_bitmask_inplace(y, torch.zeros(2, dtype=torch.int32, device=dev))
    assert torch.isinf(y).all()
    z = torch.zeros(3, 40, device=dev)
    llmkern.ops.apply_token_bitmask_inplace(z, torch.zeros(2, 2, dtype=torch.int32, device=dev),
                                            indices=torch.tensor([1], device=dev))
    assert torch.isinf(z[1]).all() and (z[[0, 2]] == 0).all()


@pytest.mark.parametrize("V", [31, 49152, 49153])
def test_apply_bitmask_matches_xgrammar(V):
    xgr = pytest.importorskip("xgrammar")
    torch.manual_seed(V + 1)
    B = 4
    logits = torch.randn(B, V)
    m = torch.randint(-2**31, 2**31 - 1, (B, (V + 31) // 32), dtype=torch.int32)
    for kw in [dict(), dict(indices=[3, 1]), dict(vocab_size=V - 3)]:
        a, b = logits.clone(), logits.clone()
        llmkern.ops.apply_token_bitmask_inplace(a, m, **kw)
        xgr.apply_token_bitmask_inplace(b, m, **kw)
        assert torch.equal(a, b)


def test_apply_bitmask_is_registered():
    from llmkern.ops.sampling import apply_token_bitmask_inplace

    assert apply_token_bitmask_inplace is llmkern.ops.apply_token_bitmask_inplace
    x = torch.randn(2, 64)
    m = torch.zeros(2, 2, dtype=torch.int32)
    torch.ops.llmkern.apply_token_bitmask_inplace(x, m, None, -1)
    assert torch.isinf(x).all()


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def _bad_sampler_masks():
    ok = torch.full((3, 4), -1, dtype=torch.int32)
    return [
        (ok.long(), TypeError),                    # dtype
        (ok.float(), TypeError),
        (ok[:, None], ValueError),                 # rank
        (ok[:2], ValueError),                      # rows
        (ok[:, :3], ValueError),                   # too few words for 100 tokens
        (ok.t().contiguous().t(), ValueError),     # last dim not contiguous
        ([[-1] * 4] * 3, TypeError),               # not a tensor
    ]


@pytest.mark.parametrize("mask,exc", _bad_sampler_masks())
def test_sampler_rejects_bad_bitmask(mask, exc):
    with pytest.raises(exc, match="token_bitmask"):
        llmkern.sampling_from_logits(torch.randn(3, 100), token_bitmask=mask)


def test_apply_bitmask_rejects_bad_input():
    x = torch.randn(2, 100)
    ok = torch.full((2, 4), -1, dtype=torch.int32)
    for bad, exc, name in [
        (dict(bitmask=ok.long()), TypeError, "bitmask"),
        (dict(bitmask=ok[:1]), ValueError, "bitmask"),
        (dict(bitmask=ok[:, :3], vocab_size=97), ValueError, "bitmask"),  # too few words
        (dict(bitmask=ok, vocab_size=101), ValueError, "vocab_size"),
        (dict(bitmask=ok, indices=[2]), ValueError, "indices"),
        (dict(bitmask=ok.unsqueeze(0)), ValueError, "bitmask"),
    ]:
        with pytest.raises(exc, match=name):
            llmkern.ops.apply_token_bitmask_inplace(x.clone(), **bad)


def test_mask_on_another_device_is_rejected(backend):
    if backend.name != "cuda":
        pytest.skip("needs two devices")
    with pytest.raises(ValueError, match="token_bitmask"):
        llmkern.sampling_from_logits(torch.randn(3, 100, device="cuda"),
                                     token_bitmask=torch.full((3, 4), -1, dtype=torch.int32))


def test_opcheck_with_bitmask():
    ops = llmkern.ops
    logits = torch.randn(3, 64)
    m = pack(torch.rand(3, 64) < 0.5)
    m[:, 0] = -1
    torch.library.opcheck(ops.sampling_from_logits.op,
                          (logits, True, None, None, 1.0, None, 0, None, 1.0, None, 0.0, "joint", None, 3, None, 0, m))
    torch.library.opcheck(ops.softmax.op, (logits, None, 0.5, m))
    torch.library.opcheck(ops.apply_token_bitmask_inplace.op, (logits.clone(), m, torch.tensor([2, 0]), 60))
    tp = torch.softmax(torch.randn(2, 3, 64), -1)
    ids = torch.randint(0, 64, (2, 2), dtype=torch.int32)
    zeros = lambda: torch.zeros(2, dtype=torch.int32)  # noqa: E731
    full = pack(torch.ones(6, 64, dtype=torch.bool)).view(2, 3, -1)
    torch.library.opcheck(ops.chain_speculative_sampling.op, (None, ids, tp, zeros(), zeros(), None, 1, None, 2, full))
