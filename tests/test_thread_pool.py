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


# Kernels whose work is split over threads (GEMM, GEMV, norms, split-KV decode attention, prefill
# attention, the split-row sampling team), and a small engine's greedy tokens: saved by each
# configuration, compared bit for bit.
_KERNELS = r"""
import os, sys, torch, llmkern
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
r = lambda *s: torch.randn(*s, generator=g)
out = {}
x, w = r(37, 300), r(500, 300)
out["gemm"] = llmkern.linear_packed(x, llmkern.pack_linear_weight(w), 500)
x1, w1 = r(1, 576), r(1536, 576)
out["gemv_packed"] = llmkern.linear_packed(x1, llmkern.pack_linear_weight(w1), 1536)
out["gemv_bf16"] = llmkern.linear_small_m(x1.bfloat16(), w1.bfloat16())
out["gemm_bf16"] = llmkern.linear_packed(x.bfloat16(), llmkern.pack_linear_weight_bf16(w), 500)
out["gemm_bf16_gated"] = llmkern.linear_packed_silu_mul(x.bfloat16(), llmkern.pack_gate_up_weight_bf16(w, w), 500)
h, wn = r(64, 576), r(576)
o = torch.empty_like(h)
llmkern.rms_norm(o, h, wn, 1e-5)
out["rms_norm"] = o
for dt in (torch.float32, torch.bfloat16):
    nseq, ctx, bs = 3, 700, 16
    nblk = (ctx + bs - 1) // bs
    kc, vc = r(nseq * nblk, bs, 3, 64).to(dt), r(nseq * nblk, bs, 3, 64).to(dt)
    bt = torch.randperm(nseq * nblk, generator=g).to(torch.int32).view(nseq, nblk)
    q = r(nseq, 1, 9, 64).to(dt)
    lens = torch.tensor([ctx, 300, 650], dtype=torch.int32)
    out[f"decode_{dt}"] = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt)
    qp, kp, vp = r(300, 9, 64).to(dt), r(300, 3, 64).to(dt), r(300, 3, 64).to(dt)
    cu = torch.tensor([0, 300], dtype=torch.int32)
    out[f"prefill_{dt}"] = llmkern.flash_attn_varlen_func(qp, kp, vp, cu, cu, 300, 300, causal=True)
out["sample_wide"] = llmkern.sampling_from_logits(r(1, 1 << 17), seed=3, offset=0)
out["sample_rows"] = llmkern.sampling_from_logits(r(8, 5000), seed=4, offset=0)
from llmkern import LLM, SamplingParams
cfg = dict(model_type="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=2, vocab_size=4096, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
llm = LLM(cfg, load_format="dummy", num_gpu_blocks=64, block_size=16, dtype=os.environ["DTYPE"])
prompts = [[(7 * i + 3 * j) % 4000 + 10 for j in range(40 + 30 * i)] for i in range(3)]
res = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
out["engine_tokens"] = torch.tensor([o.token_ids for o in res])
out["info"] = llmkern.build_info()
torch.save(out, sys.argv[1])
"""


def _kernel_outputs(tmp_path, mode, threads, dtype="float32"):
    path = tmp_path / f"{mode}-{threads}-{dtype}.pt"
    code = f"import sys; sys.argv = ['x', {str(path)!r}]\n" + _KERNELS
    run_python(code, timeout=300, LLMKERN_THREADS=mode, OMP_NUM_THREADS=str(threads), DTYPE=dtype)
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_identical_across_modes_and_thread_counts(tmp_path, dtype):
    base = _kernel_outputs(tmp_path, "pool", 1, dtype)
    assert base["info"]["num_threads"] == 1
    # A build without OpenMP (wheels: LLMKERN_OPENMP=OFF) has the pool alone.
    runs = [(m, n) for m, n in (("pool", 2), ("pool", 3), ("openmp", 2), ("openmp", 5))
            if m in base["info"]["threads_compiled"]]
    for mode, n in runs:
        got = _kernel_outputs(tmp_path, mode, n, dtype)
        assert got["info"]["threads"] == mode and got["info"]["num_threads"] == n, got["info"]
        for key, ref in base.items():
            if key != "info":
                assert torch.equal(got[key], ref), f"{key} differs with {mode} x {n} threads"


def _hog(cpu=None):
    """A CPU-bound process (optionally pinned), to be killed by the caller."""
    import os
    import subprocess
    import sys

    def pin():
        if cpu is not None:
            os.sched_setaffinity(0, [cpu])

    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)


@pytest.mark.parametrize("mode", ["pool", "openmp"])
def test_no_hang_oversubscribed(mode):
    """8 threads on this machine's CPUs with a CPU hog beside them: every kernel (the split-row
    sampling team meets at barriers) still finishes, correctly, in bounded time."""
    import os

    code = (
        "import torch, llmkern, torch.nn.functional as F\n"
        "llmkern.set_num_threads(8)\n"
        "x, w = torch.randn(37, 300), torch.randn(500, 300)\n"
        "p = llmkern.pack_linear_weight(w)\n"
        "ref = F.linear(x.double(), w.double())\n"
        "logits = torch.randn(2, 1 << 17)\n"
        "want = logits.argmax(-1).int()\n"
        "kc, vc = torch.randn(64, 16, 3, 64), torch.randn(64, 16, 3, 64)\n"
        "bt = torch.arange(64, dtype=torch.int32).view(2, 32)\n"
        "q = torch.randn(2, 1, 9, 64)\n"
        "lens = torch.tensor([512, 300], dtype=torch.int32)\n"
        "a0 = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt)\n"
        "for i in range(200):\n"
        "    assert (llmkern.linear_packed(x, p, 500).double() - ref).abs().max() < 1e-3\n"
        "    assert torch.equal(llmkern.sampling_from_logits(logits, temperature=0.0, seed=0, offset=0), want)\n"
        "    assert torch.equal(llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt), a0)\n"
    )
    cpus = sorted(os.sched_getaffinity(0))
    hog = _hog(cpus[0])
    try:
        run_python(code, timeout=240, LLMKERN_THREADS=mode)
    finally:
        hog.kill()
        hog.wait()


def test_cpu_lists_and_shares():
    from llmkern.cpu_affinity import parse_cpus

    assert parse_cpus("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert llmkern.format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    for bad in ("", "a", "3-1", "-1", "1,,x"):
        with pytest.raises(ValueError, match="cpus"):
            parse_cpus(bad)
    cpus = list(range(10))
    parts = [llmkern.cpu_share(i, 3, cpus) for i in range(3)]
    assert sorted(c for p in parts for c in p) == cpus and all(len(p) in (3, 4) for p in parts)
    assert [llmkern.cpu_share(i, 4, [0, 1]) for i in range(4)] == [[0], [1], [0], [1]]
    with pytest.raises(ValueError, match="index"):
        llmkern.cpu_share(2, 2)
    with pytest.raises(ValueError, match="count"):
        llmkern.cpu_share(0, 0)
    with pytest.raises(ValueError, match="cpus"):
        llmkern.set_cpu_affinity([100000])
    with pytest.raises(ValueError, match="threads"):
        llmkern.set_cpu_affinity(sorted(llmkern.cpu_affinity.allowed_cpus()), threads=0)


def test_thread_count_follows_affinity_and_quota():
    import os

    info = llmkern.build_info()
    assert 1 <= info["available_cpus"] <= len(os.sched_getaffinity(0))
    assert info["cgroup_cpu_limit"] >= 0
    if info["cgroup_cpu_limit"]:
        assert info["available_cpus"] <= info["cgroup_cpu_limit"]
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (
        "import os, torch, llmkern, torch.nn.functional as F\n"
        f"assert os.sched_getaffinity(0) == {{{cpu}}}, os.sched_getaffinity(0)\n"
        "assert llmkern.get_num_threads() == 1 and torch.get_num_threads() == 1\n"
        "x, w = torch.randn(37, 300), torch.randn(500, 300)\n"
        "assert (llmkern.linear_packed(x, llmkern.pack_linear_weight(w), 500).double()"
        " - F.linear(x.double(), w.double())).abs().max() < 1e-3\n"
        "for tid in os.listdir('/proc/self/task'):  # every thread, the kernels' workers included\n"
        f"    assert os.sched_getaffinity(int(tid)) == {{{cpu}}}, tid\n"
    )
    run_python(code, LLMKERN_CPUS=str(cpu))
    # A process started on one CPU (as by taskset) sizes its pool to it without being told.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import llmkern; print(llmkern.get_num_threads())"],
                         preexec_fn=lambda: os.sched_setaffinity(0, [cpu]), capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    with pytest.raises(AssertionError, match="LLMKERN_CPUS"):
        run_python("import llmkern", LLMKERN_CPUS="x")


def test_logits_to_float_in_serial_chunks():
    """compute_logits converts bf16 logits to fp32 in chunks below torch's parallel grain (no
    torch OpenMP region beside the kernels' pool); values as .float() gives them."""
    from llmkern.layers.embed_head import _SERIAL_CHUNK, _to_float

    for shape in [(3, 49152), (1, 5), (2, _SERIAL_CHUNK + 1)]:
        x = torch.randn(shape).to(torch.bfloat16)
        y = _to_float(x)
        assert y.dtype == torch.float32 and y.shape == x.shape and torch.equal(y, x.float())
    z = torch.randn(4, 7)
    assert _to_float(z) is z


@pytest.mark.parametrize("threads,placement", [(2, "nudge"), (2, "off"), (3, "nudge"), (8, "off")])
def test_hand_off_under_stress(threads, placement):
    """Back-to-back jobs whose chunk counts rise and fall, with team jobs between them: every chunk
    runs exactly once, before its job returns. A worker late for a finished job (woken late,
    preempted, or moving itself) once claimed a slot of it while the next, larger job was being
    set up: the join then never ended or a slot ran on a dead frame (a hang or crash about once in
    17 decode benchmark runs). Such a late claim hung this check within ~10^4 jobs. A subprocess,
    since the failure is a hang."""
    code = (
        "from llmkern import _C\n"
        "bad = sum(_C.thread_pool_selftest(20000, m) for m in (3, 8, 64) for _ in range(3))\n"
        "assert bad == 0, bad\n"
    )
    run_python(code, timeout=120, OMP_NUM_THREADS=str(threads), LLMKERN_THREAD_PLACEMENT=placement)


def test_selftest_rejects_bad_arguments():
    from llmkern import _C

    with pytest.raises(ValueError, match="jobs"):
        _C.thread_pool_selftest(-1)
    with pytest.raises(ValueError, match="max_chunks"):
        _C.thread_pool_selftest(10, 0)
