"""`llmkern explore` without a browser: the page's embedded data against the database read with plain
SQL (all runs, and the runs `--only` filters keep), the page is self-contained (no network), hostile
names cannot break out of it, every bad database or option is a one-line error naming the option,
and --serve answers on loopback. The page's own filters (in the browser) are checked by
test_explore_browser.py."""
from __future__ import annotations

import json
import re
import sqlite3
import threading
import urllib.error
import urllib.request

import pytest

pytest.importorskip("plotly", reason="the explorer needs plotly (pip install 'llmkern[explore]')")

from explore_helpers import build_db, build_empty_db, ok_results  # noqa: E402

from llmkern import cli  # noqa: E402
from llmkern.explore import data, page  # noqa: E402
from llmkern.explore.cli import build_page  # noqa: E402
from llmkern.explore.serve import make_server  # noqa: E402


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_db(str(tmp_path_factory.mktemp("explore") / "runs.sqlite"))


def embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="explore-data">(.*?)</script>', html, re.S)
    assert m, "no embedded data in the page"
    return json.loads(m.group(1))


def one_line_error(argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    msg = e.value.code
    assert isinstance(msg, str), f"exit code {msg!r} instead of an error message"
    assert "\n" not in msg.strip() and msg.startswith("llmkern explore:"), msg
    return msg


def test_page_data_matches_database(db):
    d = data.load(db)
    expected = ok_results(db)
    assert [r["id"] for r in d["runs"]] == [str(r["id"]) for r in expected]
    for run, ref in zip(d["runs"], expected):
        assert run["knobs"] == ref["knobs"] and run["command"] == ref["serve_command"]
        assert run["machine"] == str(ref["machine_id"]) and run["workload"] == ref["workload"]
        assert run["model"] == ref["model"].rstrip("/").split("/")[-1]
        m = ref["measured"]
        assert run["metrics"].get("throughput") == m.get("output_throughput")
        for db_name, page_name in (("ttft_median", "ttft_p50"), ("itl_p95", "itl_p95"), ("e2e_latency_p99", "e2e_p99"),
                                   ("ttft_mean", "ttft_mean")):
            if db_name in m:
                assert run["metrics"][page_name] == pytest.approx(1000 * m[db_name]), db_name  # seconds -> ms
            else:
                assert page_name not in run["metrics"]
        assert run["estimate"].get("throughput") == ref["estimate"].get("output_throughput")
        if "itl_median" in ref["estimate"]:
            assert run["estimate"]["itl_p50"] == pytest.approx(1000 * ref["estimate"]["itl_median"])
        assert "decode_step_time" not in run["estimate"]  # estimator-only names are not plotted
        assert run["slo"] == ("no SLO" if not ref["constraints"] else "meets" if ref["meets"] else "misses")
        assert run["best"] == ref["best"]
        assert run["load"] == ref["load"]       # quiet / busy (other work) / not recorded
        # estimates for other hardware: apart from the measurements, in the page's names and units
        assert set(run["profile_estimates"]) == set(ref["layers"])
        for prof, est in ref["layers"].items():
            assert run["profile_estimates"][prof]["throughput"] == est["output_throughput"]
            assert run["profile_estimates"][prof]["ttft_p50"] == pytest.approx(1000 * est["ttft_median"])
        assert {k: len(v) for k, v in run["requests"].items()} == ref["requests"]  # completed requests only
        assert all(v == sorted(v) for v in run["requests"].values())
    knob_names = {k for r in expected for k in r["knobs"]}
    assert set(d["knobs"]) == knob_names
    con = sqlite3.connect(db)
    assert set(d["machines"]) == {str(i) for (i,) in con.execute("SELECT id FROM machines")}
    con.close()
    assert "no GPU" in d["machines"]["1"]["label"] and "Test GPU 80GB" in d["machines"]["2"]["label"]
    assert d["estimate_profiles"] == {"H100": "estimate on H100 (datasheet peaks; not measured)"}
    assert {r["load"] for r in d["runs"]} == {"quiet", "busy (other work)", "not recorded"}


def test_page_is_self_contained(db):
    html = build_page(db)
    assert embedded(html)["runs"] == data.load(db)["runs"]
    assert "<script src=" not in html and "<link" not in html  # nothing fetched: plotly is inlined
    assert page.plotly_js()[:2000] in html
    for tag in ("pareto-ttft", "pareto-itl", "pareto-e2e", "estimate-throughput", "explore-status", "explore-errors"):
        assert f'id="{tag}"' in html


def test_hostile_names_stay_inside_the_page(tmp_path):
    from llmkern.optimize import db as runs_db

    evil = '</script><script>alert(1)</script><!--'
    path = str(tmp_path / "evil.sqlite")
    with runs_db.open_db(path) as db:
        m = db.add_machine(evil, 2)
        w = db.add_workload(evil, "serve", {})
        s = db.start_sweep(evil, m, w, "0.1.0")
        db.record_result(s, {"knob": evil}, "ok", {"output_throughput": 1.0, "ttft_median": 0.1},
                         serve_command="llmkern serve " + evil)
    html = build_page(path)
    assert evil not in html
    assert html.count("</script>") == 6  # the page's own six script elements, none closed early
    d = embedded(html)
    assert d["runs"][0]["workload"] == evil and d["runs"][0]["knobs"] == {"knob": evil}


def test_cli_writes_page(db, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert cli.main(["explore", "--db", db, "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert embedded(out.read_text())["runs"] == data.load(db)["runs"]


@pytest.mark.parametrize("make, needle", [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: p.write_text("not a database at all\n" * 50), "not an SQLite runs database"),
    (lambda p: sqlite3.connect(str(p)).execute("CREATE TABLE other(x)").connection.commit(), "not a llmkern runs database"),
])
def test_bad_db_is_a_clear_error(tmp_path, make, needle):
    path = tmp_path / "bad.sqlite"
    make(path)
    msg = one_line_error(["explore", "--db", str(path), "--out", str(tmp_path / "x.html")])
    assert msg.startswith("llmkern explore: --db:") and needle in msg
    assert not (tmp_path / "x.html").exists()


def test_newer_schema_is_a_clear_error(tmp_path):
    path = str(build_empty_db(str(tmp_path / "new.sqlite")))
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    con.commit()
    con.close()
    assert "schema version 999" in one_line_error(["explore", "--db", path, "--out", str(tmp_path / "x.html")])


def test_empty_db_says_so(tmp_path):
    path = build_empty_db(str(tmp_path / "empty.sqlite"))
    msg = one_line_error(["explore", "--db", path, "--out", str(tmp_path / "x.html")])
    assert "holds no successful runs" in msg and "llmkern optimize" in msg


def test_only_failed_runs_count_as_empty(tmp_path):
    from llmkern.optimize import db as runs_db

    path = str(tmp_path / "failed.sqlite")
    with runs_db.open_db(path) as db:
        s = db.start_sweep("m", db.add_machine("cpu", 2), db.add_workload("chat", "serve", {}), "0.1.0")
        db.record_result(s, {"max_num_seqs": 8}, "failed", {}, error="boom")
    assert "holds no successful runs" in one_line_error(["explore", "--db", path])


def test_bad_options(db, tmp_path, monkeypatch):
    assert "--port" in one_line_error(["explore", "--db", db, "--serve", "--port", "70000"])
    assert "--out" in one_line_error(["explore", "--db", db, "--out", str(tmp_path / "no" / "dir" / "p.html")])
    assert "--screenshot" in one_line_error(["explore", "--db", db, "--screenshot", str(tmp_path / "no" / "s.png")])
    monkeypatch.setattr("llmkern.explore.browser.find_chromium", lambda: None)
    msg = one_line_error(["explore", "--db", db, "--screenshot", str(tmp_path / "s.png")])
    assert "--screenshot" in msg and "Chromium" in msg


def test_serve_on_loopback(db):
    server = make_server(lambda: build_page(db, allow_empty=True), port=0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            assert embedded(r.read().decode())["runs"] == data.load(db)["runs"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
        assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=10)
    assert not t.is_alive()


def test_serve_reports_unreadable_db(tmp_path):
    def broken():
        raise RuntimeError(f"--db: no such file: {tmp_path / 'gone.sqlite'}")

    server = make_server(broken, port=0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=30)
        assert e.value.code == 500 and b"no such file" in e.value.read()
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=10)


def test_report_notes_a_missing_browser(db, tmp_path, monkeypatch):
    from llmkern.bench import report
    from llmkern.explore.report_section import EXPLORER_PNG, explorer_section

    monkeypatch.setattr("llmkern.explore.browser.find_chromium", lambda: None)
    paths = report.write_report({"records": [], "machine": {}, "limits": {}}, str(tmp_path), extra=explorer_section(db))
    md = open(paths["markdown"]).read()
    assert "## Performance Explorer" in md and "Chromium was not found" in md
    assert not (tmp_path / EXPLORER_PNG).exists()


def test_cli_serve_process(db):
    """`llmkern explore --serve --port 0` in its own process: prints its loopback URL, serves the
    page, and is stopped and reaped by the test."""
    import os
    import signal
    import subprocess
    import sys

    import llmkern

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(llmkern.__file__))))
    # SIGINT as a terminal's Ctrl-C delivers it: the default handler restored, since a shell's
    # background job (how CI may run) ignores SIGINT and a child inherits that. -X faulthandler:
    # should it still not exit, SIGABRT makes it print every thread's stack (below).
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "llmkern.cli", "explore", "--db", db,
                             "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = ""
        timer = threading.Timer(120, proc.kill)  # a hung start cannot block readline forever
        timer.start()
        try:
            line = proc.stdout.readline()
        finally:
            timer.cancel()
        m = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        assert m, f"no URL printed: {line!r}"
        with urllib.request.urlopen(m.group(1), timeout=60) as r:
            assert embedded(r.read().decode())["runs"] == data.load(db)["runs"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean exit
        try:
            assert proc.wait(timeout=30) == 0
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out = proc.communicate(timeout=30)[0]
            pytest.fail(f"no exit within 30 s of Ctrl-C; where its threads were:\n{out}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("only, where", [
    (["workload=chat"], {"workload": ["chat"]}),
    (["workload=chat", "max_num_seqs=8", "speculative=none"],
     {"workload": ["chat"], "knob.max_num_seqs": [8], "knob.speculative": [None]}),
    (["model=/models/tiny-llama"], {"model": ["/models/tiny-llama"]}),
    (["model=tiny-llama", "machine=1"], {"model": ["/models/tiny-llama"], "machine_id": [1]}),
    (["speculative=ngram:4", "machine=Test CPU 16-core (16 cores, Test GPU 80GB)"],
     {"knob.speculative": ["ngram:4"], "machine_id": [2]}),
])
def test_only_filters_the_embedded_runs(db, tmp_path, only, where):
    out = tmp_path / "page.html"
    argv = ["explore", "--db", db, "--out", str(out)]
    for o in only:
        argv += ["--only", o]
    assert cli.main(argv) == 0
    d = embedded(out.read_text())
    expected = ok_results(db, where)
    assert [r["id"] for r in d["runs"]] == [str(r["id"]) for r in expected] and expected
    # a sweep's pick stays the pick among all its runs, shown or not
    assert [r["best"] for r in d["runs"]] == [r["best"] for r in expected]
    assert {s["id"] for s in d["sweeps"]} == {r["sweep_id"] for r in expected}
    assert set(d["knobs"]) == {k for r in expected for k in r["knobs"]}


def test_only_errors(db):
    assert "--only: expected KEY=VALUE" in one_line_error(["explore", "--db", db, "--only", "chat"])
    msg = one_line_error(["explore", "--db", db, "--only", "workload=chatt"])
    assert "matches --only workload=chatt" in msg and "workloads: chat, offline" in msg
