"""The benchmarks as pytest-benchmark tests (not part of the main test run, which is `pytest tests`):

    pytest bench/ --benchmark-json=bench.json [--bench-full] [--bench-device cuda] [--bench-report DIR]
    llmkern bench report bench.json              # the same Markdown / PNG report as `llmkern bench`

One test per benchmark module runs its run() once under the `benchmark` fixture; pytest-benchmark
times the whole module, and every figure of the module (llmkern, peer, ratio, % of the machine
limit) goes into the test's extra_info["records"], together with the machine description and the
limits measured in the same session.
"""
from __future__ import annotations

import importlib
import math
import os
import sys
import time

import pytest

try:
    import llmkern  # noqa: F401
except ImportError:  # a source checkout with the in-tree dev build
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from llmkern.bench import common, suite  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("llmkern benchmarks")
    g.addoption("--bench-device", default="cpu", choices=("cpu", "cuda"), help="device of the benchmark tensors")
    g.addoption("--bench-full", action="store_true", help="full shapes (default: the --quick shapes)")
    g.addoption("--bench-report", default=None, metavar="DIR", help="also write the Markdown/JSON/PNG report here")


@pytest.fixture(scope="session")
def bench_session(request):
    """Options, machine description and limits (measured once), and the records of the session."""
    import torch

    cfg = request.config
    device = cfg.getoption("--bench-device")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("--bench-device cuda but torch sees no CUDA GPU")
    quick = not cfg.getoption("--bench-full")
    common.configure(quick=quick)
    state = {"device": device, "quick": quick, "machine": suite.machine_info(),
             "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
             "limits": suite.machine_limits(device), "records": [], "modules": []}
    yield state
    out = cfg.getoption("--bench-report")
    if out:
        from llmkern.bench import report

        res = {"suite": "pytest", "command": "pytest bench/ --bench-report " + out, "quick": quick, "device": device,
               "started": state["started"], **{k: state[k] for k in ("machine", "limits", "records", "modules")}}
        paths = report.write_report(res, out)
        print(f"\nbenchmark report: {paths['markdown']}")


@pytest.fixture
def bench_module(benchmark, bench_session):
    """bench_module(name, group): run llmkern.bench.<name> under pytest-benchmark and check its records."""

    def run(name: str, group: str) -> list:
        if not os.path.exists(os.path.join(suite.HERE, name + ".py")):
            pytest.skip(f"{name}.py is not present in this build")
        mod = importlib.import_module("llmkern.bench." + name)
        benchmark.group = group
        try:
            records = benchmark.pedantic(mod.run, kwargs={"quick": bench_session["quick"], "device": bench_session["device"]},
                                         rounds=1, iterations=1)
        except SystemExit as e:  # a module that does not apply here (e.g. GPU-only on a CPU run)
            benchmark.has_error = True  # no timing to save: keeps --benchmark-json valid
            pytest.skip(str(e.code))
        benchmark.extra_info.update(
            suite=group, device=bench_session["device"], quick=bench_session["quick"],
            records=[r.as_dict() for r in records], limits=bench_session["limits"], machine=bench_session["machine"])
        bench_session["records"].extend(records)
        bench_session["modules"].append({"name": name, "suite": group, "status": "ok", "seconds": 0.0,
                                         "records": len(records), "note": ""})
        assert records, f"{name}.run() returned no figures"
        for r in records:
            assert isinstance(r, common.Record), type(r)
            assert r.llmkern_s > 0 and math.isfinite(r.llmkern_s), r
            assert r.peer_s is None or (r.peer_s > 0 and math.isfinite(r.peer_s)), r
            assert r.llmkern_value is None or math.isfinite(r.llmkern_value), r
        return records

    return run
