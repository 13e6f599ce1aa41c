"""The CPU kernels' threads (csrc/common/thread_pool.h): every thread count gives the same
results in both modes (OpenMP and llmkern's own pool), and a forked child gets a pool of its own."""
import multiprocessing as mp

import pytest
import torch
import torch.nn.functional as F

import llmkern
from runtime_helpers import run_python


def _gemm():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 300, generator=g), torch.randn(500, 300, generator=g)
    return llmkern.linear_packed(x, llmkern.pack_linear_weight(w), 500), F.linear(x.double(), w.double())


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_thread_counts_agree(n):
    before = llmkern.get_num_threads()
    try:
        llmkern.set_num_threads(n)
        assert llmkern.get_num_threads() == n
        out, ref = _gemm()
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)
    finally:
        llmkern.set_num_threads(before)


def _child(q, x, p, ref):
    # Only llmkern runs in the child: torch's own OpenMP pool is not fork-safe.
    q.put(float((llmkern.linear_packed(x, p, ref.shape[1]).double() - ref).abs().max()))


def test_forked_child_runs_kernels():
    _gemm()  # the parent's pool exists (and its workers) before the fork
    x, w = torch.randn(37, 300), torch.randn(500, 300)
    ref = F.linear(x.double(), w.double())
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, x, llmkern.pack_linear_weight(w), ref))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.get(timeout=5) < 1e-3


def test_set_num_threads_rejects_zero():
    with pytest.raises(ValueError, match="n"):
        llmkern.set_num_threads(0)


@pytest.mark.parametrize("mode", ["pool", "openmp"])
def test_each_mode_in_a_subprocess(mode):
    """The mode is decided once per process. The split-row sampling path meets at team barriers."""
    code = (
        "import torch, llmkern, torch.nn.functional as F\n"
        "info = llmkern.build_info()\n"
        f"assert info['threads'] == {mode!r} or (info['threads'] == 'pool' and {mode!r} == 'openmp'), info\n"
        "x, w = torch.randn(37, 300), torch.randn(500, 300)\n"
        "out = llmkern.linear_packed(x, llmkern.pack_linear_weight(w), 500)\n"
        "assert (out.double() - F.linear(x.double(), w.double())).abs().max() < 1e-3\n"
        "logits = torch.randn(1, 1 << 18)\n"
        "a = llmkern.sampling_from_logits(logits, seed=3, offset=0)\n"
        "llmkern.set_num_threads(1)\n"
        "b = llmkern.sampling_from_logits(logits, seed=3, offset=0)\n"
        "assert torch.equal(a, b)\n"
    )
    run_python(code, LLMKERN_THREADS=mode)


def test_fork_before_any_kernel_ran():
    """The fork handler is registered at import: a child forked before the parent's first kernel
    still stays off the parent's OpenMP runtime."""
    code = (
        "import os, torch, llmkern\n"
        "x, w = torch.randn(37, 300), torch.randn(500, 300)\n"
        "p = llmkern.pack_linear_weight(w)  # torch's own threads have run (torch ops stay in the parent:\n"
        "ref = x @ w.T                      # its OpenMP runtime is not fork-safe)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = (llmkern.linear_packed(x, p, 500) - ref).abs().max().item() < 1e-3\n"
        "    os._exit(0 if ok and llmkern.build_info()['threads'] == 'pool' else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.WEXITSTATUS(status) == 0, status\n"
    )
    run_python(code, timeout=60)
