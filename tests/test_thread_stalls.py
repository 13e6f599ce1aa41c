"""The pool's adaptive thread count (csrc/common/stall_guard.h): after a join that waited on a
descheduled worker the caller runs jobs alone for a while. Results are the same bits either way,
and the counters it keeps (llmkern._C.thread_pool_stats) obey the policy's invariants."""
import os
import subprocess
import sys

import pytest
import torch

import llmkern
from llmkern import _C


def test_stats_count_pool_jobs():
    before = llmkern.get_num_threads()
    try:
        llmkern.set_num_threads(2)
        s0 = _C.thread_pool_stats()
        w = llmkern.pack_linear_weight(torch.randn(512, 256))
        llmkern.linear_packed(torch.randn(64, 256), w, 512)
        s1 = _C.thread_pool_stats()
    finally:
        llmkern.set_num_threads(before)
    assert set(s1) == {"jobs", "chunks", "worker_chunks", "solo_jobs", "stalls", "wait_us", "stall_wait_us",
                       "worker_jobs", "colocated", "nudges"}
    ran = s1["jobs"] - s0["jobs"] + s1["solo_jobs"] - s0["solo_jobs"]
    assert ran >= 1  # the GEMM went through the pool (or, after a stall, ran on the caller)
    assert 0 <= s1["worker_chunks"] - s0["worker_chunks"] <= s1["chunks"] - s0["chunks"]
    assert s1["stall_wait_us"] <= s1["wait_us"]


# Every parallel kernel family, many times. With WORKER_CPU set, the calling thread runs on
# CALLER_CPU and every other thread (the pool's workers) on WORKER_CPU, where busy loops run too:
# workers are descheduled mid-chunk while the caller waits for them. Saves outputs and counters.
_SQUEEZED = r"""
import os, sys, threading, torch, llmkern
from llmkern import _C
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
r = lambda *s: torch.randn(*s, generator=g)
llmkern.set_num_threads(int(os.environ["THREADS"]))
llmkern.linear_packed(torch.randn(64, 64), llmkern.pack_linear_weight(torch.randn(256, 64)), 256)  # pool up
if os.environ.get("WORKER_CPU"):
    me = threading.get_native_id()
    for tid in map(int, os.listdir("/proc/self/task")):
        os.sched_setaffinity(tid, [int(os.environ["CALLER_CPU" if tid == me else "WORKER_CPU"])])
x, w = r(37, 300), r(500, 300)
p = llmkern.pack_linear_weight(w)
x1, w1 = r(1, 576), r(1536, 576)
p1 = llmkern.pack_linear_weight(w1)
h, wn = r(64, 576), r(576)
kc, vc = r(64, 16, 3, 64), r(64, 16, 3, 64)
bt = torch.arange(64, dtype=torch.int32).view(2, 32)
q, lens = r(2, 1, 9, 64), torch.tensor([512, 300], dtype=torch.int32)
logits = r(1, 1 << 17)
out = {}
s0 = _C.thread_pool_stats()
for i in range(int(os.environ["ROUNDS"])):
    o = torch.empty_like(h)
    llmkern.rms_norm(o, h, wn, 1e-5)
    got = {"gemm": llmkern.linear_packed(x, p, 500), "gemv": llmkern.linear_packed(x1, p1, 1536), "norm": o,
           "decode": llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt),
           "sample": llmkern.sampling_from_logits(logits, seed=3, offset=0)}
    for k, v in got.items():
        assert k not in out or torch.equal(out[k], v), (k, i)  # the same bits in every round
        out[k] = v
s1 = _C.thread_pool_stats()
out["stats"] = {k: v - s0[k] for k, v in s1.items()}
torch.save(out, sys.argv[1])
"""


def _squeezed(tmp_path, threads, adaptive, cpus=None, rounds=60):
    path = tmp_path / f"{threads}-{adaptive}.pt"
    code = f"import sys; sys.argv = ['x', {str(path)!r}]\n" + _SQUEEZED
    env = dict(os.environ, THREADS=str(threads), ROUNDS=str(rounds), LLMKERN_THREADS="pool",
               LLMKERN_ADAPTIVE_THREADS=adaptive)
    if cpus:
        env.update(CALLER_CPU=str(cpus[0]), WORKER_CPU=str(cpus[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return torch.load(path, weights_only=False)


def test_shrinks_on_stalls_with_the_same_results(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: the caller's and its workers'")
    cpus = cpus[:2]
    base = _squeezed(tmp_path, 1, "1", rounds=2)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, [cpus[1]])) for _ in range(2)]
    try:
        on = _squeezed(tmp_path, 3, "1", cpus)
        off = _squeezed(tmp_path, 3, "0", cpus)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for got in (on, off):
        for key, ref in base.items():
            if key != "stats":
                assert torch.equal(got[key], ref), key
    assert off["stats"]["solo_jobs"] == 0  # LLMKERN_ADAPTIVE_THREADS=0: the workers always join in
    # A second stall can only come from a pooled job after the first stall's solo stretch (8 jobs
    # or more).
    s = on["stats"]
    assert s["stalls"] < 2 or s["solo_jobs"] >= 8, s
    print("adaptive:", s, "fixed:", off["stats"])
