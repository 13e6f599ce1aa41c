"""Token bitmasks in speculative verification (chain_speculative_sampling with per-position
masks, on every backend) and in the engine's Sampler (the keyword the grammar layer calls)."""
import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
import llmkern  # noqa: E402
from goodness_of_fit import assert_follows  # noqa: E402
from test_token_bitmask import pack  # noqa: E402


def _masked(p, allowed):
    m = torch.where(allowed, p.double(), torch.zeros_like(p.double()))
    return m / m.sum()


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_spec_output_follows_the_masked_target(backend, with_draft_probs):
    # Exactness of the verification for the masked target: the first emitted token follows it
    # whatever the drafts (half of them disallowed here).
    torch.manual_seed(2)
    dev = backend.device
    V, n = 600, 2
    B = 1500 if backend.emulated else 8000
    p = torch.softmax(torch.randn(V) * 1.5, -1)
    allowed = torch.rand(V) < 0.4
    allowed[0] = True
    q = torch.softmax(torch.randn(V) * 1.5, -1)
    ids = torch.multinomial(q, B * n, replacement=True).view(B, n)
    target = p.expand(B, n + 1, V).contiguous()
    mask = pack(allowed[None]).view(1, 1, -1).expand(B, n + 1, -1).contiguous()
    draft = q.expand(B, n, V).contiguous() if with_draft_probs else None
    out, _, emitted = llmkern.chain_speculative_sampling(
        draft.to(dev) if draft is not None else None, ids.to(dev), target.to(dev), seed=9, offset=0,
        token_bitmask=mask.to(dev))
    out, emitted = out.cpu(), emitted.cpu()
    first = out[:, 0].long()
    assert allowed[first].all()
    disallowed_draft = ~allowed[ids[:, 0]]
    assert disallowed_draft.any() and (emitted[disallowed_draft] == 0).all(), "a disallowed draft was accepted"
    assert_follows(first, _masked(p, allowed))


def test_spec_greedy_target_equals_masked_greedy(backend):
    # Greedy verification: the target is the one-hot of the masked argmax (softmax at temperature
    # 0 with the mask); drafts of the unmasked argmax are rejected and replaced by it.
    dev = backend.device
    B, n, V = 4, 3, 500
    logits = torch.randn(B * (n + 1), V)
    allowed = torch.rand(B * (n + 1), V) < 0.3
    allowed[:, 1] = True
    m = pack(allowed).to(dev)
    target = llmkern.softmax(logits.to(dev), 0.0, token_bitmask=m).view(B, n + 1, V)
    best = torch.where(allowed, logits, torch.tensor(float("-inf"))).argmax(-1).view(B, n + 1)
    raw = logits.argmax(-1).view(B, n + 1)
    ids = best[:, :n].clone()
    ids[1, 1] = raw[1, 1] if not allowed.view(B, n + 1, V)[1, 1, raw[1, 1]] else (best[1, 1] + 1) % V
    out, _, _ = llmkern.chain_speculative_sampling(None, ids.to(dev), target.contiguous(), seed=0, offset=0,
                                                   token_bitmask=m.view(B, n + 1, -1))
    out = out.cpu()
    for b in range(B):
        want = best[b].tolist() if b != 1 else best[b, :2].tolist() + [-1, -1]
        assert out[b].tolist() == want


def test_spec_position_with_nothing_allowed_emits_minus_one(backend):
    dev = backend.device
    p = torch.zeros(1, 2, 64)
    p[..., 5] = 1.0
    allowed = torch.zeros(2, 64, dtype=torch.bool)
    allowed[:, 9] = True  # allowed, but without target mass
    out, _, emitted = llmkern.chain_speculative_sampling(None, torch.tensor([[5]], device=dev), p.to(dev), seed=0,
                                                         offset=0, token_bitmask=pack(allowed).view(1, 2, -1).to(dev))
    assert out.cpu().tolist() == [[-1, -1]] and emitted.cpu().tolist() == [0]


def test_spec_rejects_bad_bitmask():
    p = torch.softmax(torch.randn(2, 3, 100), -1)
    ids = torch.zeros(2, 2, dtype=torch.int64)
    for bad in [torch.full((2, 3, 3), -1, dtype=torch.int32), torch.full((2, 4), -1, dtype=torch.int32),
                torch.full((2, 2, 4), -1, dtype=torch.int32), torch.full((2, 3, 4), -1, dtype=torch.int64)]:
        with pytest.raises((ValueError, TypeError), match="token_bitmask"):
            llmkern.chain_speculative_sampling(None, ids, p, token_bitmask=bad)


# ---------------------------------------------------------------------------------------------
# The engine's Sampler
# ---------------------------------------------------------------------------------------------

def _seqs(params):
    from llmkern.engine.sequence import Request, Sequence

    return [Sequence(i, Request(f"r{i}", None, [1, 2, 3], p), 0, None) for i, p in enumerate(params)]


def test_sampler_applies_the_bitmask_to_every_kind_of_row():
    from llmkern import SamplingParams
    from llmkern.engine.sampler import Sampler

    torch.manual_seed(0)
    V = 1000
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.8, top_k=50, top_p=0.9), SamplingParams(temperature=1.0, min_p=0.05),
              SamplingParams(temperature=0, repetition_penalty=1.2)]
    seqs = _seqs(params)
    sampler = Sampler(V, [2], torch.device("cpu"), 0)
    for trial in range(20):
        logits = torch.randn(len(seqs), V) * 3
        allowed = torch.rand(len(seqs), V) < 0.05
        allowed[:, 7] = True
        toks = sampler(logits.clone(), seqs, token_bitmask=pack(allowed))
        assert all(allowed[i, t] for i, t in enumerate(toks)), trial
        assert toks[0] == int(torch.where(allowed[0], logits[0], torch.tensor(float("-inf"))).argmax())
    # all-greedy fast path
    logits = torch.randn(2, V)
    allowed = torch.rand(2, V) < 0.05
    allowed[:, 3] = True
    toks = sampler(logits, _seqs([SamplingParams(temperature=0)] * 2), token_bitmask=pack(allowed))
    assert toks == torch.where(allowed, logits, torch.tensor(float("-inf"))).argmax(-1).tolist()


def test_filtered_probs_with_mask_is_the_masked_distribution():
    from llmkern import SamplingParams
    from llmkern.engine.row_filters import RowFilters, filtered_probs

    V = 800
    logits = torch.randn(3, V)
    allowed = torch.rand(3, V) < 0.2
    f = RowFilters.of([SamplingParams(temperature=0.7)] * 3, logits)
    got = filtered_probs(logits, f, token_bitmask=pack(allowed))
    want = torch.softmax(torch.where(allowed, logits, torch.tensor(float("-inf"))).double() / 0.7, -1)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
