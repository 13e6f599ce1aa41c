"""chain_speculative_sampling: acceptance of identical drafts, the emitted distribution equals the
target's (the theorem speculative sampling rests on), greedy targets reproduce argmax decoding,
one-hot (n-gram) drafts, counters. On every backend (fewer trials on the emulator, with bounds
for the trials taken, plus agreement with the CPU kernels)."""
import torch

import llmkern
from goodness_of_fit import assert_follows
from test_sampling import on_cpu


def _spec(backend, draft, ids, target, *counters, **kw):
    """Runs the op on the backend's device; on simt/cuda also checks the CPU kernels' outputs."""
    dev = backend.device
    mv = lambda t: t.to(dev) if t is not None else None  # noqa: E731
    before = [c.clone() for c in counters]
    got = llmkern.chain_speculative_sampling(mv(draft), mv(ids), mv(target), *[mv(c) for c in counters], **kw)
    got = tuple(t.cpu() for t in got)
    if backend.name != "cpu":
        want = on_cpu(llmkern.chain_speculative_sampling, draft, ids, target, *before, **kw)
        assert (got[0] == want[0]).double().mean().item() >= 0.98
    return got


def test_draft_equal_to_target_accepts_everything(backend):
    torch.manual_seed(0)
    b, n, V = 64, 4, 300
    p = torch.softmax(torch.randn(b, n + 1, V), -1)
    ids = torch.multinomial(p[:, :n].reshape(-1, V), 1).view(b, n).int()
    out, acc, emi = _spec(backend, p[:, :n].contiguous(), ids, p, seed=1, offset=0)
    assert torch.equal(out[:, :n], ids) and (out[:, n] >= 0).all()
    assert (acc == n).all() and (emi == n).all()


def test_emitted_tokens_follow_the_target_distribution(backend):
    torch.manual_seed(1)
    trials, n, V = (8000 if backend.emulated else 30000), 2, 12
    q = torch.softmax(torch.randn(n, V) * 1.5, -1)
    p = torch.softmax(torch.randn(n + 1, V) * 1.5, -1)
    draft = q.expand(trials, n, V)  # every trial verifies a fresh draft from the same models
    target = p.expand(trials, n + 1, V)
    ids = torch.stack([torch.multinomial(q[i], trials, replacement=True) for i in range(n)], 1)
    out, acc, emi = _spec(backend, draft, ids, target, seed=7, offset=3)
    assert_follows(out[:, 0], p[0])
    second = out[:, 1][out[:, 1] >= 0]  # emitted only after position 0 was accepted
    assert_follows(second, p[1])
    # Acceptance rate of a position is sum(min(p, q)): position 0 over all trials, position 1 over
    # the trials that reached it; `accepted` counts each position's test on its own.
    rate0 = torch.minimum(p[0], q[0]).sum().item()
    rate1 = torch.minimum(p[1], q[1]).sum().item()
    reached = emi >= 1

    def near(observed, rate, count):  # within 5 binomial standard deviations
        return abs(observed - rate) < 5 * (rate * (1 - rate) / count) ** 0.5

    assert near(reached.double().mean().item(), rate0, trials)
    assert near((emi[reached] == 2).double().mean().item(), rate1, int(reached.sum()))
    assert near(acc.double().mean().item() / 2, (rate0 + rate1) / 2, 2 * trials)
    # emitted counts agree with the output
    assert torch.equal(emi.long(), (out[:, :n] >= 0).sum(1) - (emi < n).long())


def test_one_hot_drafts_without_probabilities(backend):
    torch.manual_seed(2)
    trials, V = (8000 if backend.emulated else 30000), 10
    p = torch.softmax(torch.randn(2, V), -1)
    ids = torch.full((trials, 1), 3, dtype=torch.int64)  # an n-gram proposer always proposes 3
    out, acc, emi = _spec(backend, None, ids, p.expand(trials, 2, V), seed=4, offset=0)
    assert_follows(out[:, 0], p[0])
    rate = (emi == 1).double().mean().item()
    assert abs(rate - p[0, 3].item()) < 5 * (p[0, 3].item() / trials) ** 0.5 + 1e-3


def test_greedy_target_reproduces_argmax_decoding(backend):
    torch.manual_seed(3)
    b, n, V = 200, 5, 50
    greedy = torch.randint(0, V, (b, n + 1))
    target = torch.nn.functional.one_hot(greedy, V).float()
    draft = torch.softmax(torch.randn(b, n, V), -1)
    ids = greedy[:, :n].clone()
    wrong = torch.rand(b, n) < 0.2
    ids[wrong] = (ids[wrong] + 1) % V
    out, _, emi = _spec(backend, draft, ids, target, seed=0, offset=0)
    for r in range(b):
        m = next((i for i in range(n) if wrong[r, i]), n)  # first wrong draft
        want = greedy[r, : m + 1].tolist() + [-1] * (n - m)
        assert out[r].tolist() == want and emi[r] == m


def test_counters_accumulate_and_reproducibility(backend):
    torch.manual_seed(4)
    b, n, V = 8, 3, 40
    dev = backend.device
    q = torch.softmax(torch.randn(b, n, V), -1).to(dev)
    p = torch.softmax(torch.randn(b, n + 1, V), -1).to(dev)
    ids = torch.randint(0, V, (b, n)).to(dev)
    acc = torch.full((b,), 10, dtype=torch.int32, device=dev)
    emi = torch.full((b,), 10, dtype=torch.int64, device=dev)
    out1, acc1, emi1 = llmkern.chain_speculative_sampling(q, ids, p, acc, emi, seed=5, offset=1)
    assert acc1 is acc and emi1 is emi and (acc >= 10).all() and (emi >= 10).all()
    out2, acc2, emi2 = llmkern.chain_speculative_sampling(q, ids, p, seed=5, offset=1)
    assert torch.equal(out1, out2) and torch.equal(acc - 10, acc2) and torch.equal(emi - 10, emi2.long())
    # "accepted" counts every position whose test passes, so it is >= the emitted count
    assert (acc2 >= emi2).all()
