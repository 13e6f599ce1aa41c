"""conftest.py that bench/peer_suites.py copies next to a peer's test files (in a temp dir).

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
    # What the tests read of the GPU: memory (to skip huge cases), SM count, name.
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(total_memory=mem, multi_processor_count=os.cpu_count() or 1,
                                 name=f"llmkern-{BACKEND}", major=CAPABILITY[0], minor=CAPABILITY[1])


torch.cuda.get_device_capability = lambda *a, **k: CAPABILITY
torch.cuda.get_device_properties = lambda *a, **k: _device_props()
torch.cuda.device_count = lambda *a, **k: 1  # one device under test (tests parametrize over devices)
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.empty_cache = lambda *a, **k: None

_shim = importlib.import_module(f"{SUITE.replace('-', '_')}_shim")
_shim.install()
globals().update(getattr(_shim, "fixtures", dict)())

_records: dict = {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for it in items:
        params = getattr(getattr(it, "callspec", None), "params", {})
        _records[it.nodeid] = {"function": it.originalname or it.name,
                               "params": {k: repr(v) for k, v in params.items()}}
    if SAMPLE > 0:
        # A fixed sample of each test function's cases (same seed = same cases).
        by_fn: dict = {}
        for it in items:
            by_fn.setdefault(it.originalname or it.name, []).append(it)
        keep = set()
        rng = random.Random(SEED)
        for fn in sorted(by_fn):
            group = by_fn[fn]
            keep.update(id(it) for it in (group if len(group) <= SAMPLE else rng.sample(group, SAMPLE)))
        deselected = [it for it in items if id(it) not in keep]
        items[:] = [it for it in items if id(it) in keep]
        config.hook.pytest_deselected(items=deselected)


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


def pytest_sessionfinish(session, exitstatus):
    with open(SIDECAR, "w") as f:
        json.dump(_records, f)
