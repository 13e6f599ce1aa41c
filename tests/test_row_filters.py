"""engine/row_filters.py: the distribution a request samples from (the sampler's and speculative
decoding's), per row, against the sorting references of reference.py on fp64 softmax(logits / T)."""
import types

import pytest
import torch

from llmkern.engine.row_filters import RowFilters, filtered_probs
from reference import ref_keep, ref_min_p_keep
from test_sampling import safe_top_p

V = 1000


def params(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    return types.SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def ref_probs(x, p):
    """softmax(x / T) on top-k, then top-p of the top-k set, then min-p (of the row's max), fp64."""
    if p.temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(), V).double()
    w = torch.softmax(x.double() / p.temperature, -1)
    keep = ref_keep(w, top_k=p.top_k, top_p=p.top_p, order="top_k_first") & ref_min_p_keep(w, p.min_p)
    d = torch.where(keep, w, torch.zeros_like(w))
    return d / d.sum()


def top_p_for(x, temperature, top_k, target):
    """A top_p far from every boundary of the (top-k set's) fp64 distribution."""
    w = torch.softmax(x.double() / temperature, -1)
    kk = ref_keep(w, top_k=top_k)
    return safe_top_p(torch.where(kk, w, torch.zeros_like(w)), target)


def min_p_for(x, p):
    """A min_p that keeps the n largest weights of what row params `p`'s other filters keep (n: half,
    at most 3, so that the weights at the cut are large), halfway (in ratio) between the two weights
    around the cut: far from any boundary, and a cut that moves shows."""
    w = ref_probs(x, p)
    r = torch.sort(w[w > 0], descending=True).values / w.max()
    assert r.numel() >= 2, "choose another row"
    n = min(r.numel() // 2, 3)
    return float((r[n - 1] * r[n]).sqrt())


@pytest.mark.parametrize("min_p_rows", [False, True])
def test_filtered_probs_match_the_references(min_p_rows):
    torch.manual_seed(3)
    x = torch.randn(8, V) * 3
    ps = [params(0.7, top_k=20), params(1.3, top_p=top_p_for(x[1], 1.3, 0, 0.6)),
          params(0.5, top_k=30, top_p=top_p_for(x[2], 0.5, 30, 0.8)), params(1.0, top_k=-1),
          params(1.0, top_k=5000),   # above the vocabulary: clamped, no top-k
          params(0.0), params(0.6), params(0.8, top_k=40, top_p=top_p_for(x[7], 0.8, 40, 0.9))]
    if min_p_rows:
        ps[6].min_p, ps[7].min_p = min_p_for(x[6], ps[6]), min_p_for(x[7], ps[7])
    f = RowFilters.of(ps, x)
    assert (f.use_top_k, f.use_top_p, f.use_min_p) == (True, True, min_p_rows)
    assert f.top_k.tolist() == [20, V, 30, V, V, V, V, 40]
    got = filtered_probs(x, f)
    assert got.dtype == torch.float32 and got.is_contiguous()
    for i, p in enumerate(ps):
        torch.testing.assert_close(got[i].double(), ref_probs(x[i], p), rtol=1e-5, atol=1e-7, msg=f"row {i}")


def test_without_min_p_stops_before_it():
    torch.manual_seed(4)
    x = torch.randn(2, V) * 3
    plain = [params(0.8, top_k=50), params(1.2)]
    ps = [params(p.temperature, top_k=p.top_k, min_p=min_p_for(x[i], p)) for i, p in enumerate(plain)]
    got = filtered_probs(x, RowFilters.of(ps, x), min_p=False)
    for i, p in enumerate(plain):
        torch.testing.assert_close(got[i].double(), ref_probs(x[i], p), rtol=1e-5, atol=1e-7)
