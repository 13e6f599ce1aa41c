"""Where the pool's workers run (csrc/common/thread_placement.h, LLMKERN_THREAD_PLACEMENT).

Each case runs in a subprocess whose CPUs the test chooses: a worker forced onto the caller's
CPU moves off it once another CPU is allowed again (read from /proc), results are the same bits
in every placement mode, and nothing hangs with more pool threads than allowed CPUs or when
set_cpu_affinity changes the mask under a running pool."""
import os
import subprocess
import sys

import pytest
import torch

# Parallel kernels of several families, saved after every phase; the phases move the threads.
_SCRIPT = r"""
import contextlib, os, sys, threading, time, torch, llmkern
from llmkern import _C
from llmkern.bench.bench_placement import pool_tids, _last_cpu

cpus = [int(c) for c in os.environ["CPUS"].split(",")]
g = torch.Generator().manual_seed(1)
r = lambda *s: torch.randn(*s, generator=g)
x, p = r(37, 300), llmkern.pack_linear_weight(r(500, 300))
x1, p1 = r(1, 576), llmkern.pack_linear_weight(r(1536, 576))
h, wn = r(64, 576), r(576)
logits = r(1, 1 << 17)

def kernels():
    o = torch.empty_like(h)
    llmkern.rms_norm(o, h, wn, 1e-5)
    return {"gemm": llmkern.linear_packed(x, p, 500), "gemv": llmkern.linear_packed(x1, p1, 1536), "norm": o,
            "sample": llmkern.sampling_from_logits(logits, seed=3, offset=0)}

def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)

@contextlib.contextmanager
def placement_paused():
    # A worker late for the last job may be mid-nudge (its temporary one-CPU mask set, its own not
    # yet back, and then restored over any mask set meanwhile): pausing waits for it to finish.
    _C.pause_thread_placement(True)
    try:
        yield
    finally:
        _C.pause_thread_placement(False)

def masks():
    with placement_paused():
        return [sorted(os.sched_getaffinity(t)) for t in [me] + workers]

llmkern.set_num_threads(2)
ref = kernels()
for _ in range(20):  # warm-up
    assert same(kernels(), ref)
me = threading.get_native_id()
workers = pool_tids()
out = {"ref": ref, "workers": len(workers)}

def pin_all(cs):
    with placement_paused():
        for t in [me] + workers:
            os.sched_setaffinity(t, cs)

if os.environ["PHASE"] == "colocate":
    # Caller and worker on one CPU for a while, then both CPUs allowed again.
    pin_all([cpus[0]])
    s0 = _C.thread_pool_stats()
    end = time.monotonic() + 5
    while True:  # the caller may run a job's chunks before the worker gets the CPU: until it joins one
        for _ in range(5):
            assert same(kernels(), ref)
        s1 = _C.thread_pool_stats()
        if s1["colocated"] > s0["colocated"] or time.monotonic() > end:
            break
    out["forced_colocated"] = s1["colocated"] - s0["colocated"]
    out["forced_nudges"] = s1["nudges"] - s0["nudges"]
    pin_all(cpus)
    end, apart = time.monotonic() + 5, False
    while time.monotonic() < end and not apart:
        assert same(kernels(), ref)
        apart = all(_last_cpu(t) != _last_cpu(me) for t in workers)
    out["apart"] = apart
    s2 = _C.thread_pool_stats()
    out["nudges"] = s2["nudges"] - s1["nudges"]
    out["after_colocated"] = s2["colocated"] - s1["colocated"]
elif os.environ["PHASE"] == "masks":
    # Two pool threads on one allowed CPU (oversubscribed), then both CPUs again, via the API.
    llmkern.set_cpu_affinity([cpus[0]], threads=2)
    for _ in range(50):
        assert same(kernels(), ref)
    out["one_cpu_masks"] = masks()
    llmkern.set_cpu_affinity(cpus, threads=2)
    for _ in range(50):
        assert same(kernels(), ref)
    out["two_cpu_masks"] = masks()
out["stats"] = _C.thread_pool_stats()
torch.save(out, sys.argv[1])
"""


def _two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    return cpus[:2]


def _run(tmp_path, mode, phase, cpus):
    path = tmp_path / f"{mode}-{phase}.pt"
    # LLMKERN_PLACEMENT_IDLE=0: move without waiting for the other CPU to look idle (which, on
    # a machine other processes keep busy, it may never do during the test)
    env = dict(os.environ, CPUS=",".join(map(str, cpus)), PHASE=phase, LLMKERN_THREADS="pool",
               LLMKERN_THREAD_PLACEMENT=mode, LLMKERN_PLACEMENT_IDLE="0")
    env.pop("LLMKERN_CPUS", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], env=env, capture_output=True, text=True,
                         timeout=180, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    assert out.returncode == 0, out.stderr
    return torch.load(path, weights_only=False)


def test_worker_leaves_the_callers_cpu_with_the_same_bits(tmp_path):
    cpus = _two_cpus()
    runs = {m: _run(tmp_path, m, "colocate", cpus) for m in ("off", "nudge", "bind")}
    got = runs["nudge"]
    assert got["workers"] == 1
    # Pinned to one CPU with the caller, the worker is counted as co-located and cannot move.
    assert got["forced_colocated"] > 0 and got["forced_nudges"] == 0, got
    # Both CPUs allowed again: /proc shows them apart soon, and a worker that joined a job on the
    # caller's CPU moved off it (the scheduler may also have moved it first: then no nudge).
    assert got["apart"] and (got["nudges"] >= 1 or got["after_colocated"] == 0), got
    assert runs["off"]["stats"]["nudges"] == 0 and runs["bind"]["stats"]["nudges"] == 0
    ref = runs["off"]["ref"]
    for m, r in runs.items():
        for k, v in ref.items():
            assert torch.equal(r["ref"][k], v), (m, k)


def test_no_hang_when_the_mask_changes(tmp_path):
    cpus = _two_cpus()
    got = _run(tmp_path, "nudge", "masks", cpus)
    assert got["workers"] == 1
    assert got["one_cpu_masks"] == [[cpus[0]], [cpus[0]]]
    # The nudges give a worker back the mask it had, not one from before set_cpu_affinity.
    assert got["two_cpu_masks"] == [cpus, cpus], got


def test_build_info_names_the_mode():
    import llmkern

    assert llmkern.build_info()["thread_placement"] in ("nudge", "bind", "off")
