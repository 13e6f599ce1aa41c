"""llmkern optimize: the sweep/constraint grammar, the runs database, Pareto fronts, and a tiny sweep
end to end through `llmkern serve` subprocesses (database rows, --continue after a killed run)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from llmkern.optimize import db as dbm
from llmkern.machine_load import is_busy
from llmkern.optimize.grammar import Constraint, parse_constraints, parse_sweep
from llmkern.optimize.report import best, pareto_front

from serve_helpers import package_root, tiny_model_dir


# -- grammar ------------------------------------------------------------------------------------
def test_sweep_lists_ranges_fixed_and_product():
    cfgs = parse_sweep("max_num_seqs=[8,32];max_num_batched_tokens=range(256,4097,1024);speculative=[none,ngram:4]")
    assert len(cfgs) == 2 * 4 * 2
    assert cfgs[0] == {"max_num_seqs": 8, "max_num_batched_tokens": 256, "speculative": None}
    assert cfgs[1] == {"max_num_seqs": 8, "max_num_batched_tokens": 256, "speculative": "ngram:4"}
    assert {c["max_num_batched_tokens"] for c in cfgs} == {256, 1280, 2304, 3328}
    assert parse_sweep("block_size=32") == [{"block_size": 32}]
    assert parse_sweep("x=range(3)") == [{"x": 0}, {"x": 1}, {"x": 2}]
    assert parse_sweep("a=[1.5, on, off, 'q r']") == [{"a": 1.5}, {"a": True}, {"a": False}, {"a": "q r"}]
    assert parse_sweep("") == [{}]


def test_sweep_paired_keys():
    cfgs = parse_sweep("tp*dp=[(1,2),(2,1)];max_num_seqs=[8]")
    assert cfgs == [{"tp": 1, "dp": 2, "max_num_seqs": 8}, {"tp": 2, "dp": 1, "max_num_seqs": 8}]


@pytest.mark.parametrize("spec,token", [
    ("max_num_seqs", "max_num_seqs"),                       # no '='
    ("max_num_seqs=[8,32", "[8,32"),                        # unclosed list
    ("max_num_seqs=range(1,x)", "range(1,x)"),              # non-integer range
    ("max_num_seqs=range(5,1)", "range(5,1)"),              # empty range
    ("max_num_seqs=range(1,9,0)", "range(1,9,0)"),          # zero step
    ("max_num_seqs=[]", "max_num_seqs=[]"),                 # empty list
    ("9bad=[1]", "9bad"),                                   # bad key
    ("a=[1];a=[2]", "'a'"),                                 # key twice
    ("tp*dp=[(1,2),(2)]", "(2)"),                           # tuple size
    ("tp*dp=[1,2]", "tp*dp=[1,2]"),                         # not tuples
    ("a=[x$y]", "x$y"),                                     # unreadable value
])
def test_sweep_errors_name_the_token(spec, token):
    with pytest.raises(ValueError) as e:
        parse_sweep(spec)
    assert token in str(e.value)


def test_constraints():
    cs = parse_constraints("ttft:p95<500ms; itl:median<=0.05s;e2e_latency:mean<2000")
    assert cs == [Constraint("ttft", "p95", "<", 0.5), Constraint("itl", "median", "<=", 0.05),
                  Constraint("e2e_latency", "mean", "<", 2.0)]
    assert cs[0].name == "ttft_p95"
    assert cs[0].ok({"ttft_p95": 0.4}) and not cs[0].ok({"ttft_p95": 0.5}) and not cs[0].ok({})
    assert cs[1].ok({"itl_median": 0.05})


@pytest.mark.parametrize("spec,token", [("tpot:p95<1ms", "'tpot'"), ("ttft:p90<1ms", "'p90'"),
                                        ("ttft:p95<1h", "'h'"), ("ttft:p95>1ms", "ttft:p95>1ms"),
                                        ("ttft<1ms", "ttft<1ms")])
def test_constraint_errors_name_the_token(spec, token):
    with pytest.raises(ValueError) as e:
        parse_constraints("itl:p95<50ms;" + spec)
    assert token in str(e.value)


def test_knob_names_checked_against_serve_options():
    from llmkern.optimize import knobs

    assert knobs.canonical({"tp": 2, "max_num_seqs": 8, "request_rate": 1.5}) == \
        {"tensor_parallel_size": 2, "max_num_seqs": 8, "request_rate": 1.5}
    with pytest.raises(ValueError, match="'max_num_seq'.*did you mean 'max_num_seqs'"):
        knobs.canonical({"max_num_seq": 8})
    with pytest.raises(ValueError, match="'port'"):
        knobs.canonical({"port": 1})
    with pytest.raises(ValueError, match="'request_rate'"):
        knobs.canonical({"request_rate": -1})
    flags = knobs.serve_flags({"max_num_seqs": 8, "speculative": None, "prefix_caching": False,
                               "tensor_parallel_size": 2})
    assert flags == ["--max-num-seqs", "8", "--no-prefix-caching", "--tensor-parallel-size", "2"]


# -- Pareto front ------------------------------------------------------------------------------
def _pt(x, y):
    return {"knobs": {"x": x, "y": y}, "metrics": {"output_throughput": x, "ttft_p95": y}, "estimate": {},
            "serve_command": ""}


def _front_brute(pts):
    """Independent check: p is on the front iff no q is >= in throughput, <= in latency, and differs."""
    out = []
    for p in pts:
        px, py = p["metrics"]["output_throughput"], p["metrics"]["ttft_p95"]
        dominated = False
        for q in pts:
            qx, qy = q["metrics"]["output_throughput"], q["metrics"]["ttft_p95"]
            if (qx, qy) != (px, py) and qx >= px and qy <= py:
                dominated = True
        if not dominated:
            out.append((px, py))
    return sorted(out)


def test_pareto_front_synthetic():
    pts = [_pt(10, 1.0), _pt(20, 2.0), _pt(15, 3.0), _pt(30, 5.0), _pt(25, 5.0), _pt(5, 0.5), _pt(30, 6.0),
           _pt(20, 2.0)]
    front = [(p["metrics"]["output_throughput"], p["metrics"]["ttft_p95"]) for p in pareto_front(pts)]
    assert sorted(set(front)) == [(5, 0.5), (10, 1.0), (20, 2.0), (30, 5.0)]
    import random

    rng = random.Random(3)
    for _ in range(20):
        pts = [_pt(rng.randint(1, 20), rng.randint(1, 20) / 10) for _ in range(15)]
        got = sorted((p["metrics"]["output_throughput"], p["metrics"]["ttft_p95"]) for p in pareto_front(pts))
        assert got == _front_brute(pts)
    missing = [_pt(10, 1.0), {"knobs": {}, "metrics": {"output_throughput": 50}, "estimate": {}}]
    assert len(pareto_front(missing)) == 1


def test_best_under_constraints():
    pts = [_pt(10, 0.2), _pt(30, 0.9), _pt(20, 0.4)]
    assert best(pts)["metrics"]["output_throughput"] == 30
    assert best(pts, parse_constraints("ttft:p95<500ms"))["metrics"]["output_throughput"] == 20
    assert best(pts, parse_constraints("ttft:p95<100ms")) is None


# -- database ----------------------------------------------------------------------------------
def test_db_roundtrip_readonly_and_versions(tmp_path):
    path = str(tmp_path / "r.sqlite")
    with dbm.open_db(path) as d:
        assert d.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert d.schema_version == dbm.SCHEMA_VERSION
        m = d.add_machine("cpu x", 2, None, 8.0, {"bandwidth_gbs": 10.0}, "shared machine")
        assert d.add_machine("cpu x", 2, None, 8.0, {"bandwidth_gbs": 12.0}, "shared machine") == m
        assert d.add_machine("cpu x", 2, None, 8.0, {"bandwidth_gbs": 10.0}, "other notes") != m
        w = d.add_workload("chat", "serve", {"rate": 1}, 4)
        s = d.start_sweep("model-a", m, w, "0.1", "max_num_seqs=[8]")
        rid = d.record_result(s, {"max_num_seqs": 8}, "ok", {"output_throughput": 10.0, "ttft_p95": 0.5},
                              {"output_throughput": 9.0}, [{"ok": True, "ttft": 0.1, "itls": [0.01, 0.02]},
                                                           {"ok": False}], "llmkern serve --max-num-seqs 8")
        # re-recording the same configuration replaces it (one row per sweep and configuration)
        rid2 = d.record_result(s, {"max_num_seqs": 8}, "ok", {"output_throughput": 11.0}, {}, [], "cmd")
        assert len(list(d.iter_results())) == 1 and d.latencies(rid2) == []
        assert d.conn.execute("SELECT count(*) FROM latencies").fetchone()[0] == 0
        d.record_result(s, {"max_num_seqs": 32}, "failed", {}, {}, [], "cmd", error="boom")
        with pytest.raises(KeyboardInterrupt):          # an interrupted write leaves nothing behind
            with d.transaction():
                d.conn.execute("INSERT INTO configurations(key, knobs_json) VALUES ('k', '{}')")
                raise KeyboardInterrupt
        assert d.conn.execute("SELECT count(*) FROM configurations WHERE key='k'").fetchone()[0] == 0
        d.finish_sweep(s)
        d.export_readonly(str(tmp_path / "ro.sqlite"))
    with dbm.open_db(str(tmp_path / "ro.sqlite"), readonly=True) as r:
        res = list(r.iter_results())
        assert [x["knobs"] for x in res] == [{"max_num_seqs": 8}]
        assert res[0]["metrics"] == {"output_throughput": 11.0} and res[0]["model"] == "model-a"
        assert [x["error"] for x in r.iter_results(status="failed")] == ["boom"]
        assert r.machines()[0]["limits"] == {"bandwidth_gbs": 10.0} and r.machines()[0]["notes"] == "shared machine"
        assert r.workloads()[0]["spec"] == {"rate": 1} and r.sweeps()[0]["status"] == "done"
        assert r.knob_names() == ["max_num_seqs"] and r.models() == ["model-a"]
        assert list(r.iter_results(knobs={"max_num_seqs": 32}, status=None))[0]["status"] == "failed"
    c = sqlite3.connect(path)
    c.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    c.commit()
    c.close()
    with pytest.raises(dbm.SchemaError, match="schema version 99"):
        dbm.open_db(path)
    foreign = str(tmp_path / "foreign.sqlite")
    c = sqlite3.connect(foreign)
    c.execute("CREATE TABLE t (x)")
    c.close()
    with pytest.raises(dbm.SchemaError, match="not a llmkern runs database"):
        dbm.open_db(foreign)
    with pytest.raises(FileNotFoundError):
        dbm.open_db(str(tmp_path / "nope.sqlite"), readonly=True)


def test_shipped_database_opens_readonly():
    path = dbm.default_db_path()
    if not os.path.exists(path):
        pytest.skip("no shipped runs database in this tree")
    with dbm.open_db(readonly=True) as r:
        res = list(r.iter_results())
        assert res and r.machines() and r.workloads()
        assert all(x["metrics"].get("output_throughput") for x in res)
        # the estimate models llmkern's engine: every llmkern run has one, other frameworks' none
        assert all(bool(x["estimate"].get("output_throughput")) == (x["framework"] == "llmkern") for x in res)
        assert {x["framework"] for x in res} >= {"llmkern", "vllm"}
        # taken on a quiet machine: each run's load recorded, none flagged busy
        assert all(x["machine_load"].get("foreign_cpu") is not None for x in res)
        assert not any(is_busy(x["machine_load"]) for x in res)


# -- end to end --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("opt")
    model = tiny_model_dir(str(d / "tiny"))
    wl = d / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"hello number {i}", "max_tokens": 6}) + "\n" for i in range(4)))
    return model, str(wl), d


def _optimize_argv(model, wl, db, extra=()):
    return [sys.executable, "-m", "llmkern.cli", "optimize", "--model", model, "--workload", wl,
            "--request-rate", "20", "--sweep", "max_num_seqs=[1,2];max_concurrency=[2]",
            "--constraints", "ttft:p95<20s", "--db", db, "--profile", "H100", "--timeout", "120", "-q", *extra]


def _env():
    return dict(os.environ, PYTHONPATH=package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(argv, timeout=240):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env())


def test_tiny_sweep_rows_continue_after_kill(tiny, capsys):
    model, wl, d = tiny
    db = str(d / "runs.sqlite")
    # First run: killed once the first configuration's result is committed.
    p = subprocess.Popen(_optimize_argv(model, wl, db), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=_env(), start_new_session=True)
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and p.poll() is None:
            if os.path.exists(db):
                try:
                    with dbm.open_db(db, readonly=True) as r:
                        if list(r.iter_results(status=None)):
                            break
                except (sqlite3.OperationalError, dbm.SchemaError):
                    pass
            time.sleep(0.3)
        assert p.poll() is None, "the sweep finished before it could be killed"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)   # the sweep and its server subprocess
        p.wait(30)
    with dbm.open_db(db, readonly=True) as r:
        first = list(r.iter_results(status=None))
        assert len(first) == 1 and r.sweeps()[0]["status"] == "running"
    # --continue runs only the missing configuration, in the same sweep.
    out = _run(_optimize_argv(model, wl, db, ["--continue"]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "continuing sweep 1: 1 of 2" in out.stderr
    assert "best under ttft:p95<20000ms" in out.stdout and "llmkern serve --model" in out.stdout
    with dbm.open_db(db, readonly=True) as r:
        res = list(r.iter_results())
        assert len(r.sweeps()) == 1 and r.sweeps()[0]["status"] == "done"
        assert sorted(x["knobs"]["max_num_seqs"] for x in res) == [1, 2]
        assert res[0]["id"] == first[0]["id"]           # the first result was kept, not re-run
        for x in res:
            m = x["metrics"]
            assert m["completed"] == 4 and m["requests"] == 4
            assert m["output_throughput"] > 0 and m["ttft_p95"] >= m["ttft_median"] > 0
            assert x["estimate"]["output_throughput"] > 0 and x["estimate"]["itl_median"] > 0
            lat = r.latencies(x["id"])
            assert len(lat) == 4 and all(l["ok"] and l["output_tokens"] == 6 for l in lat)
            # the stored percentile is the one of the stored per-request rows
            ttfts = sorted(l["ttft"] for l in lat)
            assert min(ttfts) <= m["ttft_median"] <= max(ttfts)
            assert f"--max-num-seqs {x['knobs']['max_num_seqs']}" in x["serve_command"]
            load = x["machine_load"]   # the load over the run is stored with every result
            assert load["load_1m_before"] >= 0 and load["load_1m_after"] >= 0 and 0 <= load["foreign_cpu"] <= 1
        assert r.machines()[0]["limits"]["profile"] == "H100"
    # --report prints the stored sweep again without running anything
    from llmkern.cli import main

    assert main(["optimize", "--report", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "## sweep 1:" in text and "Pareto front, output_throughput vs ttft_p95" in text


def _server_pids(model_dir: str):
    """pids of `llmkern serve` processes for this test's model (to check none is left behind)."""
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmd and model_dir.encode() in cmd:
                pids.append(int(pid))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="lists processes through /proc")
def test_ctrl_c_leaves_database_consistent(tiny, tmp_path):
    model, wl, _ = tiny
    db = str(tmp_path / "int.sqlite")
    # SIGINT as a terminal's Ctrl-C delivers it (the default handler restored: a background shell ignores it)
    p = subprocess.Popen(_optimize_argv(model, wl, db), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(),
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and p.poll() is None and not _server_pids(model):
            time.sleep(0.2)
        assert p.poll() is None, "the sweep finished before it could be interrupted"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 130 and "Traceback" not in err
    with dbm.open_db(db, readonly=True) as r:
        assert r.sweeps()[0]["status"] == "interrupted"
        assert all(x["metrics"]["completed"] == 4 for x in r.iter_results())   # only whole results
    end = time.monotonic() + 20
    while _server_pids(model) and time.monotonic() < end:
        time.sleep(0.2)
    assert _server_pids(model) == []


def test_offline_workload_in_process(tiny, tmp_path):
    model, wl, _ = tiny
    db = str(tmp_path / "off.sqlite")
    out = _run([sys.executable, "-m", "llmkern.cli", "optimize", "--model", model, "--workload", wl, "--offline",
                "--sweep", "max_num_batched_tokens=[16,64]", "--db", db, "--profile", "A100", "-q",
                "--estimate-profile", "H200", "--estimate-profile", "L40S"])
    assert out.returncode == 0, out.stderr[-2000:]
    with dbm.open_db(db, readonly=True) as r:
        res = list(r.iter_results())
        assert len(res) == 2 and r.workloads()[0]["kind"] == "offline"
        assert all(x["metrics"]["completed"] == 4 for x in res)
        for x in res:   # the same requests estimated on other hardware, kept apart from the sweep's estimate
            est = x["profile_estimates"]
            assert set(est) == {"H200", "L40S"} and est["H200"]["output_throughput"] > 0
            # the H200 has more bandwidth and FLOP/s than the L40S: its estimate is faster
            assert est["H200"]["duration"] < est["L40S"]["duration"]
            assert "output_throughput" in x["estimate"] and "H200" not in x["estimate"]
            assert x["machine_load"]["foreign_cpu"] is not None


@pytest.mark.parametrize("args,msg", [
    (["--sweep", "max_num_seqs=[1,"], "max_num_seqs=[1,"),
    (["--sweep", "bogus_knob=[1]"], "bogus_knob"),
    (["--constraints", "ttft:p42<1ms"], "p42"),
    (["--workload", "nope"], "nope"),
    (["--profile", "Z80"], "Z80"),
    (["--estimate-profile", "Z80"], "--estimate-profile: no profile 'Z80'"),
    (["--retry-busy", "-1"], "--retry-busy"),
])
def test_cli_errors_are_one_line(tiny, tmp_path, args, msg):
    from llmkern.cli import main

    model, _, _ = tiny
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--model", model, "--db", str(tmp_path / "x.sqlite"), *args])
    text = str(e.value.code)
    assert text.startswith("llmkern: optimize:") and msg in text and "\n" not in text
    assert not os.path.exists(tmp_path / "x.sqlite")        # nothing ran, nothing was written


def test_none_is_passed_where_it_is_a_choice():
    """'none' leaves an option at its default (speculative) unless the option offers it as a choice:
    a sweep of quantization=[auto,"none"] runs the dense model, not the default twice."""
    from llmkern.optimize import knobs
    from llmkern.optimize.grammar import parse_sweep

    got = [knobs.serve_flags(knobs.split(knobs.canonical(c))[0])
           for c in parse_sweep('quantization=[auto,"none"];speculative=[none]')]
    assert got == [["--quantization", "auto"], ["--quantization", "none"]]
