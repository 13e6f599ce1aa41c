"""Faults of a model-parallel engine: a worker killed mid-run, a worker that stops answering, and
the engine's own death all end cleanly -- a clear error in the engine well before any timeout
could explain it (or at the collective timeout for a hung peer), and no process left behind.
Bad layouts are refused before any process starts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams
from llmkern.distributed.executor import DistributedError

from distributed_helpers import alive, make_model, worker_children

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("dist_fault")), "llama")


def _run_until_error(llm, after_steps, act):
    eng = llm.engine
    eng.add_request([5, 6, 7, 8], LONG)
    for _ in range(after_steps):
        eng.step()
    act()
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as err:
        while eng.has_unfinished_requests():
            eng.step()
    return str(err.value), time.monotonic() - t0


def test_killed_worker_is_reported_and_everything_is_reaped(model):
    llm = LLM(model, tensor_parallel_size=2, pipeline_parallel_size=2, distributed_timeout_s=300)
    try:
        pids = [p.pid for p in llm.engine.executor.workers.procs]
        victim = pids[1]  # rank 2: the last stage
        msg, waited = _run_until_error(llm, 3, lambda: os.kill(victim, signal.SIGKILL))
        assert f"pid {victim}" in msg and "code -9" in msg, msg
        assert waited < 150  # the dead peer was noticed, not the 300 s collective timeout
        assert not any(alive(p) for p in pids) and worker_children() == []
        with pytest.raises(DistributedError, match="shut down"):  # the engine stays down
            llm.generate([[1, 2, 3]], LONG, use_tqdm=False)
    finally:
        llm.shutdown()
    assert worker_children() == []


def test_hung_worker_times_out(model):
    llm = LLM(model, tensor_parallel_size=2, distributed_timeout_s=3)
    try:
        pid = llm.engine.executor.workers.procs[0].pid
        msg, _ = _run_until_error(llm, 2, lambda: os.kill(pid, signal.SIGSTOP))
        assert "distributed_timeout_s=3" in msg or f"pid {pid}" in msg, msg
        assert not alive(pid)  # reaped although stopped
    finally:
        llm.shutdown()
    assert worker_children() == []


def test_workers_die_with_the_engine(model):
    code = (f"import sys; from llmkern import LLM\n"
            f"llm = LLM({model!r}, tensor_parallel_size=2)\n"
            f"print(*[p.pid for p in llm.engine.executor.workers.procs], flush=True)\n"
            f"import time; time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    engine = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(x) for x in engine.stdout.readline().split()]
        assert pids and all(alive(p) for p in pids)
        engine.kill()
        engine.wait()
        deadline = time.monotonic() + 60
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in pids)
    finally:
        engine.kill()
        engine.wait()
        for p in pids if "pids" in dir() else []:
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("kw,name", [
    (dict(tensor_parallel_size=3), "tensor_parallel_size"),      # 4 heads
    (dict(pipeline_parallel_size=3), "pipeline_parallel_size"),  # 2 layers
    (dict(tensor_parallel_size=0), "tensor_parallel_size"),
    (dict(distributed_timeout_s=0), "distributed_timeout_s"),
])
def test_bad_layouts_are_refused_before_starting(model, kw, name):
    with pytest.raises(ValueError, match=name):
        LLM(model, **kw)
    assert worker_children() == []


def test_unsupported_speculation_is_refused(model):
    with pytest.raises(NotImplementedError, match="speculative"):
        LLM(model, tensor_parallel_size=2, speculative=dict(method="early_exit", num_layers=1))
    assert worker_children() == []
