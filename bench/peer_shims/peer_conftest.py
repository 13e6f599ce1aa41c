"""The conftest.py that bench/peer_suites.py copies next to a peer's test files (in a temp dir;
named otherwise here so that pytest never loads it as this directory's conftest).

It makes the peer's imports resolve to llmkern's compat modules (sys.modules aliases, installed
by the suite's shim module), stands in for the CUDA device queries the tests make at import, runs
every test on the chosen llmkern backend (cpu, or simt: the CUDA kernels under the emulator),
optionally keeps a deterministic sample of the parametrized cases, and records for each test its
parameters and, on failure, the source line that failed (bench/peer_suites.py classifies with
them). Configuration comes from PEER_SUITE_* environment variables set by peer_suites.py.
"""
from __future__ import annotations

import importlib
import json
import os
import random
import sys
import types

import pytest
import torch

SUITE = os.environ["PEER_SUITE_NAME"]
BACKEND = os.environ.get("PEER_SUITE_BACKEND", "cpu")
SAMPLE = int(os.environ.get("PEER_SUITE_SAMPLE", "0"))
SEED = int(os.environ.get("PEER_SUITE_SEED", "0"))
SIDECAR = os.environ["PEER_SUITE_SIDECAR"]
CAPABILITY = tuple(int(x) for x in os.environ.get("PEER_SUITE_CAPABILITY", "9.0").split("."))

sys.path.insert(0, os.environ["PEER_SUITE_SHIMS"])


def _device_props():
    # What the tests read of the GPU: memory (their own rules skip cases too big for it), SM
    # count, name. Memory: the host's, capped by PEER_SUITE_DEVICE_GIB (default 16).
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    mem = min(mem, int(float(os.environ.get("PEER_SUITE_DEVICE_GIB", "16")) * 2**30))
    return types.SimpleNamespace(total_memory=mem, multi_processor_count=os.cpu_count() or 1,
                                 name=f"llmkern-{BACKEND}", major=CAPABILITY[0], minor=CAPABILITY[1])


torch.cuda.get_device_capability = lambda *a, **k: CAPABILITY
torch.cuda.get_device_properties = lambda *a, **k: _device_props()
torch.cuda.device_count = lambda *a, **k: 1  # one device under test (tests parametrize over devices)
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.empty_cache = lambda *a, **k: None
_cpu_topk = torch.topk


def _topk_cuda_ties(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    # The tests' torch references were written on CUDA, whose topk lists tied values lower index
    # first (as the kernels under test do); CPU torch lists them the other way round.
    if out is not None or not isinstance(input, torch.Tensor) or input.is_cuda:
        return _cpu_topk(input, k, dim, largest, sorted, out=out) if out is not None else \
            _cpu_topk(input, k, dim, largest, sorted)
    values, indices = torch.sort(input, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


torch.topk = _topk_cuda_ties
torch.Tensor.topk = lambda self, *a, **k: _topk_cuda_ties(self, *a, **k)
if hasattr(torch, "accelerator"):  # newer tests ask the device-generic API
    torch.accelerator.device_count = lambda *a, **k: 1
    torch.accelerator.synchronize = lambda *a, **k: None
    torch.accelerator.set_device_index = lambda *a, **k: None

_shim = importlib.import_module(f"{SUITE.replace('-', '_')}_shim")
_shim.install()
globals().update(getattr(_shim, "fixtures", dict)())

_records: dict = {}


_cases: dict = {}  # test function -> number of parametrized cases before sampling


@pytest.hookimpl(hookwrapper=True)
def pytest_generate_tests(metafunc):
    yield
    # Sampling here, on the parametrizations, keeps pytest from building an item for every one
    # of the (hundreds of thousands of) cases: a fixed draw per function (same seed = same cases).
    name = metafunc.function.__name__
    calls = metafunc._calls
    _cases[name] = len(calls) or 1
    if SAMPLE > 0 and len(calls) > SAMPLE:
        metafunc._calls = random.Random(f"{SEED}:{name}").sample(calls, SAMPLE)


def pytest_collection_modifyitems(config, items):
    for it in items:
        params = getattr(getattr(it, "callspec", None), "params", {})
        _records[it.nodeid] = {"function": it.originalname or it.name,
                               "params": {k: repr(v) for k, v in params.items()}}


def pytest_deselected(items):
    for it in items:  # -k / -m / sampling: recorded as not selected, not as not run
        _records.setdefault(it.nodeid, {"function": it.originalname or it.name, "params": {}})["deselected"] = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if BACKEND == "simt":
        import llmkern

        with llmkern.simt_backend():
            yield
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rec = _records.setdefault(item.nodeid, {"function": item.name, "params": {}})
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        rec["outcome"] = rep.outcome
        if rep.outcome == "failed" and call.excinfo is not None:
            # The innermost frame inside the peer's test file: which assertion failed.
            line = ""
            for entry in call.excinfo.traceback:
                if str(entry.path) == str(item.path):
                    try:
                        line = str(entry.statement).strip()
                    except Exception:
                        pass
            rec["failed_line"] = line
            rec["error"] = f"{call.excinfo.typename}: {str(call.excinfo.value)[:300]}"
        _append(item.nodeid)


def _append(nodeid: str) -> None:
    # One JSON line per event, written as it happens: a crash keeps what ran before it.
    with open(SIDECAR, "a") as f:
        f.write(json.dumps({"nodeid": nodeid, **_records[nodeid]}) + "\n")


def pytest_collection_finish(session):
    _records["__cases__"] = {"function": "__cases__", "params": {}, "cases": _cases}
    for nodeid in list(_records):
        _append(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid, location):
    _records.setdefault(nodeid, {"function": nodeid, "params": {}})["started"] = True
    _append(nodeid)
