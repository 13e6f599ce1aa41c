"""llmkern.compat.flashinfer: FlashInfer 0.6.x's sampling API (signatures from its documentation),
and the behaviours an engine written against FlashInfer relies on: softmax with temperature,
integer-valued thresholds, logits sampling drawing what probability sampling draws from the
softmax, empty batches. Kernels run on every backend (cpu, simt)."""
import inspect

import pytest
import torch

import llmkern.compat.flashinfer as flashinfer
from goodness_of_fit import assert_follows

_E = inspect.Parameter.empty
_SAMPLER_TAIL = [("indices", None), ("deterministic", True), ("generator", None), ("check_nan", False),
                 ("seed", None), ("offset", None)]
# FlashInfer 0.6.x: (name, default) of every positional-or-keyword parameter, in order.
SIGNATURES = {
    "softmax": [("logits", _E), ("temperature", None), ("enable_pdl", None)],
    "sampling_from_logits": [("logits", _E), *_SAMPLER_TAIL],
    "sampling_from_probs": [("probs", _E), *_SAMPLER_TAIL, ("return_valid", False)],
    "top_p_sampling_from_probs": [("probs", _E), ("top_p", _E), *_SAMPLER_TAIL, ("return_valid", False)],
    "top_k_sampling_from_probs": [("probs", _E), ("top_k", _E), *_SAMPLER_TAIL, ("return_valid", False)],
    "min_p_sampling_from_probs": [("probs", _E), ("min_p", _E), *_SAMPLER_TAIL, ("return_valid", False)],
    "top_k_top_p_sampling_from_logits": [("logits", _E), ("top_k", _E), ("top_p", _E), ("indices", None),
                                         ("filter_apply_order", "top_k_first"), *_SAMPLER_TAIL[1:]],
    "top_k_top_p_sampling_from_probs": [("probs", _E), ("top_k", _E), ("top_p", _E), ("indices", None),
                                        ("filter_apply_order", "top_k_first"), *_SAMPLER_TAIL[1:],
                                        ("return_valid", False)],
    "top_p_renorm_probs": [("probs", _E), ("top_p", _E), ("is_deterministic", False)],
    "top_k_renorm_probs": [("probs", _E), ("top_k", _E)],
    "top_k_mask_logits": [("logits", _E), ("top_k", _E)],
    "chain_speculative_sampling": [("draft_probs", _E), ("draft_token_ids", _E), ("target_probs", _E),
                                   ("maybe_output_accepted_token_num", None),
                                   ("maybe_output_emitted_draft_token_num", None), ("deterministic", True),
                                   ("generator", None), ("seed", None), ("offset", None)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_are_flashinfers_with_extensions_keyword_only(name):
    fn = getattr(flashinfer.sampling, name)
    assert getattr(flashinfer, name) is fn
    params = list(inspect.signature(fn).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == SIGNATURES[name]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)


def test_aliases():
    assert flashinfer.sampling.top_p_renorm_prob is flashinfer.sampling.top_p_renorm_probs
    assert flashinfer.sampling.top_k_renorm_prob is flashinfer.sampling.top_k_renorm_probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_with_temperature(backend, dtype):
    torch.manual_seed(0)
    dev = backend.device
    logits = (torch.randn(5, 700) * 3).to(dtype)
    logits[1, ::3] = float("-inf")  # masked entries get probability 0
    x = logits.float().double()
    for temp in (1.0, 0.5, torch.tensor([1.0, 0.5, 2.0, 0.1, 1.3])):
        t = temp if isinstance(temp, float) else temp.double()[:, None]
        ref = torch.softmax(x / t, -1)
        got = flashinfer.sampling.softmax(logits.to(dev), temperature=temp.to(dev) if torch.is_tensor(temp) else temp)
        assert got.dtype == torch.float32 and got.shape == logits.shape
        torch.testing.assert_close(got.cpu().double(), ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(flashinfer.sampling.softmax(logits.to(dev)).cpu(),
                       flashinfer.sampling.softmax(logits.to(dev), 1.0).cpu())


def test_softmax_edge_rows(backend):
    dev = backend.device
    x = torch.randn(4, 50)
    x[1] = float("-inf")         # nothing finite: zeros
    x[2, 7] = float("inf")       # +inf logit: zeros (degenerate row)
    x[3, [4, 9]] = 30.0          # temperature 0: one-hot at the first maximum
    got = flashinfer.sampling.softmax(x.to(dev), torch.tensor([1.0, 1.0, 1.0, 0.0], device=dev)).cpu()
    torch.testing.assert_close(got[0].double(), torch.softmax(x[0].double(), -1), atol=1e-6, rtol=1e-5)
    assert (got[1] == 0).all() and (got[2] == 0).all()
    assert torch.equal(got[3], torch.nn.functional.one_hot(torch.tensor(4), 50).float())


def test_integer_threshold_tensors_are_converted(backend):
    # torch.full((B,), 1) (an int64 tensor) for top_p / min_p means 1.0, as in FlashInfer.
    torch.manual_seed(1)
    dev = backend.device
    B, V = 6, 300
    probs = torch.softmax(torch.randn(B, V), -1).to(dev)
    kw = dict(seed=3, offset=0)
    for fn, arg in ((flashinfer.sampling.top_p_sampling_from_probs, 1),
                    (flashinfer.sampling.min_p_sampling_from_probs, 0)):
        got = fn(probs, torch.full((B,), arg, device=dev), **kw)
        assert torch.equal(got, fn(probs, float(arg), **kw))
    ints = torch.full((B,), 1, dtype=torch.int32, device=dev)
    assert torch.equal(flashinfer.sampling.top_p_renorm_probs(probs, ints), flashinfer.sampling.top_p_renorm_probs(probs, 1.0))
    # top_p 0 keeps the most likely token only (an integer 0.1 truncates to 0)
    zero = flashinfer.sampling.top_p_sampling_from_probs(probs, torch.zeros(B, dtype=torch.int32, device=dev), **kw)
    assert torch.equal(zero.long().cpu(), probs.argmax(-1).cpu())


@pytest.mark.parametrize("order", ["joint", "top_k_first"])
def test_logits_path_draws_what_the_probs_path_draws_on_its_softmax(backend, order):
    # FlashInfer's guarantee: sampling from logits is softmax + sampling from probabilities, so
    # the same generator state draws the same tokens on both paths.
    torch.manual_seed(2)
    dev = backend.device
    B, V = (24, 1500) if backend.emulated else (64, 6000)
    logits = (torch.rand(B, V) * 5).to(dev)
    k, p = V // 10, 0.5
    g1 = torch.Generator(dev).manual_seed(9)
    g2 = torch.Generator(dev).manual_seed(9)
    got = flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, k, p, filter_apply_order=order, generator=g1)
    probs = flashinfer.sampling.softmax(logits)
    want = flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order=order, generator=g2)
    assert torch.equal(got, want)
    # against torch's own softmax the probabilities differ in the last bits: nearly every draw agrees
    s1 = flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, k, p, filter_apply_order=order, seed=4, offset=0)
    s2 = flashinfer.sampling.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), k, p,
                                                             filter_apply_order=order, seed=4, offset=0)
    assert (s1 == s2).double().mean().item() >= 0.95


def test_sampling_from_logits_matches_softmax_distribution():
    torch.manual_seed(3)
    logits = torch.randn(1, 400) * 2
    idx = torch.zeros(20000, dtype=torch.int32)
    s = flashinfer.sampling.sampling_from_logits(logits, indices=idx, seed=5, offset=0)
    assert_follows(s, torch.softmax(logits[0].double(), -1))
    assert torch.equal(s, flashinfer.sampling.sampling_from_probs(flashinfer.sampling.softmax(logits), indices=idx,
                                                                  seed=5, offset=0))


def test_empty_batches(backend):
    dev = backend.device
    for V in (0, 7):
        x = torch.empty(0, V, device=dev)
        assert flashinfer.sampling.softmax(x).shape == (0, V)
        assert flashinfer.sampling.sampling_from_probs(x).shape == (0,)
        assert flashinfer.sampling.sampling_from_logits(x).shape == (0,)
        assert flashinfer.sampling.top_k_sampling_from_probs(x, 5).shape == (0,)
        assert flashinfer.sampling.top_k_top_p_sampling_from_logits(x, 5, 0.9).shape == (0,)
        assert flashinfer.sampling.top_k_renorm_probs(x, 5).shape == (0, V)
        assert flashinfer.sampling.top_p_renorm_probs(x, 0.5).shape == (0, V)
        assert flashinfer.sampling.top_k_mask_logits(x, 5).shape == (0, V)


@pytest.mark.parametrize("fn,name,value", [("top_p_renorm_probs", "top_p", 0.5), ("top_k_renorm_probs", "top_k", 3),
                                           ("min_p_sampling_from_probs", "min_p", 0.1),
                                           ("top_k_mask_logits", "top_k", 3)])
def test_row_parameter_checks_use_flashinfers_wording(fn, name, value):
    # The regexes are FlashInfer's own (tests/utils/test_sampling.py), which ports may match too.
    f = getattr(flashinfer.sampling, fn)
    probs = torch.softmax(torch.randn(4, 10), -1)
    dt = torch.int32 if name == "top_k" else torch.float32
    with pytest.raises(ValueError, match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*got a 0-dimensional tensor"):
        f(probs, torch.tensor(value, dtype=dt))
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        f(probs, torch.full((4, 10), value, dtype=dt))
    with pytest.raises(ValueError, match="Sampling parameter.*batch size mismatch"):
        f(probs, torch.tensor([value], dtype=dt))
    if fn != "min_p_sampling_from_probs":  # deterministic: one value per row equals the scalar
        assert torch.equal(f(probs, torch.full((4,), value, dtype=dt)), f(probs, value))
    # with indices, one value per output row (not per probs row)
    idx = torch.tensor([0, 0, 1], dtype=torch.int32)
    out = flashinfer.sampling.top_p_sampling_from_probs(probs, torch.full((3,), 0.9), indices=idx)
    assert out.shape == (3,)
    with pytest.raises(ValueError, match="batch size mismatch"):
        flashinfer.sampling.top_p_sampling_from_probs(probs, torch.full((4,), 0.9), indices=idx)
