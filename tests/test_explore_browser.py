"""The Explorer as a person sees it: headless Chromium loads the page, runs its scripts, and the test
reads the DOM back. It fails on any console error (hooks in the page write them into the DOM;
Chromium's own log of console messages is checked too) and checks that every plot holds, as plotly
data and as drawn SVG markers, the number of points and Pareto-front points computed here from the
database with plain SQL. Skipped only where Chromium is absent (CI installs Debian's `chromium` and sets LLMKERN_REQUIRE_CHROMIUM=1,
which turns the skip into a failure)."""
from __future__ import annotations

import json
import os
import re
import struct

import pytest

pytest.importorskip("plotly", reason="the explorer needs plotly (pip install 'llmkern[explore]')")

from explore_helpers import build_db, expected_counts, ok_results  # noqa: E402

from llmkern import cli  # noqa: E402
from llmkern.explore import browser  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def chromium():
    if browser.find_chromium() is None:
        if os.environ.get("LLMKERN_REQUIRE_CHROMIUM") == "1":
            pytest.fail("LLMKERN_REQUIRE_CHROMIUM=1 but Chromium is not installed")
        pytest.skip("Chromium is not installed (apt-get install chromium); CI installs it")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp("explore_browser")
    db = build_db(str(d / "runs.sqlite"))
    page = str(d / "page.html")
    assert cli.main(["explore", "--db", db, "--out", page]) == 0
    return db, page


def load(page: str, fragment: str = "") -> tuple:
    """(status dict, html) of the page after its scripts ran; fails on any console error."""
    dom, log = browser.dump_dom(browser.file_url(page, fragment))
    errors = re.search(r'<pre id="explore-errors"[^>]*>(.*?)</pre>', dom, re.S)
    assert errors, "the page has no error element (it did not load)"
    assert json.loads(errors.group(1)) == [], f"console errors: {errors.group(1)}"
    # Chromium logs every console message of the page ("INFO:CONSOLE..."); the page itself logs
    # nothing, so any such line is plotly or the browser complaining.
    console = [line for line in log.splitlines() if ":CONSOLE" in line]
    assert not console, "console messages:\n" + "\n".join(console)
    status = re.search(r'<pre id="explore-status" data-ready="(\d)">(.*?)</pre>', dom, re.S)
    assert status and status.group(1) == "1", "the page did not finish rendering"
    return json.loads(status.group(2)), dom


def check_counts(status: dict, results: list, stat: str = "p50", everything: list = (), compared: list = (),
                 cdf: str = "ttft", layers: list = ()) -> None:
    want = expected_counts(results, stat, layers)
    # The distribution plot: one point per completed request of each compared configuration.
    want["cdf"] = {"points": sum(r["requests"][cdf] for r in compared), "pareto": 0, "best": 0}
    assert status["runs_shown"] == len(results)
    # The sweep-picks panel lists each sweep with a run shown, and names a pick where one meets the SLO.
    sweeps = {r["sweep_id"] for r in results}
    assert status["sweeps_listed"] == len(sweeps)
    assert status["picks"] == len({r["sweep_id"] for r in everything or results if r["best"] and r["sweep_id"] in sweeps})
    for plot, w in want.items():
        got = status["plots"][plot]
        assert got["points"] == w["points"], (plot, got, w)
        assert got["drawn_points"] == w["points"], (plot, got, w)  # SVG markers plotly actually drew
        assert got["pareto"] == w["pareto"], (plot, got, w)
        assert got["best"] == w["best"], (plot, got, w)
        assert got["estimated"] == w.get("estimated", 0), (plot, got, w)


def test_all_runs(site):
    db, page = site
    status, _ = load(page)
    results = ok_results(db)
    assert status["runs_total"] == len(results)
    assert status["plots"]["pareto-ttft"]["points"] > 0 and status["plots"]["estimate-throughput"]["points"] > 0
    assert status["plots"]["pareto-ttft"]["best"] > 0 and status["picks"] > 0
    check_counts(status, results)


@pytest.mark.parametrize("fragment, where, stat", [
    ("workload=chat&knob.max_num_seqs=8&knob.max_num_seqs=32",
     {"workload": ["chat"], "knob.max_num_seqs": [8, 32]}, "p50"),
    ("machine=1&model=SmolLM2-135M-Instruct&knob.speculative=none&stat=p95",
     {"machine_id": [1], "model": ["SmolLM2-135M-Instruct"], "knob.speculative": [None]}, "p95"),
    ("workload=offline", {"workload": ["offline"]}, "p50"),   # throughput only: empty latency plots
])
def test_filtered_views(site, fragment, where, stat):
    db, page = site
    status, _ = load(page, fragment)
    assert status["stat"] == stat
    check_counts(status, ok_results(db, where), stat, everything=ok_results(db))


@pytest.mark.parametrize("fragment, where, stat, layers", [
    ("load=quiet&layers=H100", {"load": ["quiet"]}, "p50", ["H100"]),
    ("layers=H100&stat=p99", {}, "p99", ["H100"]),        # the layer holds medians only: nothing at p99
    ("load=quiet&load=not+recorded", {"load": ["quiet", "not recorded"]}, "p50", []),
])
def test_load_facet_and_estimate_layers(site, fragment, where, stat, layers):
    """Runs taken while other work used the machine can be left out; estimates for other hardware
    are drawn only when asked for, as their own traces (never among the measured points or fronts)."""
    db, page = site
    status, dom = load(page, fragment)
    shown = ok_results(db, where)
    check_counts(status, shown, stat, everything=ok_results(db), layers=layers)
    if layers and stat == "p50":
        assert status["plots"]["pareto-ttft"]["estimated"] > 0
        assert "estimate on H100 (datasheet peaks; not measured)" in dom


def test_compared_configurations_show_their_serve_commands(site):
    db, page = site
    everything = ok_results(db)
    chosen = everything[1:4]
    status, dom = load(page, "cdf=itl&compare=" + ",".join(str(r["id"]) for r in chosen))
    assert status["compared"] == len(chosen)
    check_counts(status, everything, compared=chosen, cdf="itl")
    assert status["plots"]["cdf"]["points"] > 0
    table = re.search(r'<table class="compare">(.*?)</table>', dom, re.S)
    assert table, "no comparison table"
    shown = re.findall(r'<code class="command">(.*?)</code>', table.group(1))
    assert shown == [r["serve_command"] for r in chosen]
    assert status["plots"]["pareto-ttft"]["traces"] > 0


def test_a_console_error_fails_the_check(site, tmp_path):
    """The check above can fail: a page with an error in a script and a resource from the network."""
    _, page = site
    html = open(page, encoding="utf-8").read()
    bad = tmp_path / "bad.html"
    bad.write_text(html.replace('<pre id="explore-errors">',
                                '<script src="https://cdn.example.invalid/x.js"></script>'
                                '<script>undefinedFunction();</script><pre id="explore-errors">', 1))
    with pytest.raises(AssertionError) as e:
        load(str(bad))
    assert "undefinedFunction" in str(e.value) and "cdn.example.invalid" in str(e.value)


def test_screenshot(site, tmp_path):
    db, _ = site
    png = tmp_path / "explorer.png"
    assert cli.main(["explore", "--db", db, "--screenshot", str(png)]) == 0
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1400, 2000)
    assert png.stat().st_size > 50_000  # plots and tables, not a blank page


def test_benchmark_report_shows_the_explorer(site, tmp_path):
    from llmkern.bench import report
    from llmkern.explore.report_section import EXPLORER_PNG, explorer_section

    db, _ = site
    paths = report.write_report({"records": [], "machine": {}, "limits": {}}, str(tmp_path), extra=explorer_section(db))
    md = open(paths["markdown"]).read()
    png = tmp_path / EXPLORER_PNG
    assert f"![Performance Explorer]({EXPLORER_PNG})" in md and f"{len(ok_results(db))} optimiser runs" in md
    assert str(png) in paths["plots"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_controls_as_a_person_uses_them(site, tmp_path):
    """Filters unticked, the latency statistic changed, a run ticked in the table and a point
    clicked in a plot, through the page's own controls (a script standing in for the person)."""
    db, page = site
    shown = ok_results(db, {"workload": ["chat"], "knob.max_num_seqs": [8, 32]})
    ticked, clicked = str(shown[0]["id"]), str(shown[-1]["id"])
    person = f"""<script>
window.addEventListener('load', function () {{ setTimeout(function () {{
  document.querySelector('fieldset[data-key="workload"] input[value="offline"]').click();
  document.querySelector('fieldset[data-key="knob.max_num_seqs"] input[value="128"]').click();
  var stat = document.getElementById('stat');
  stat.value = 'p99';
  stat.dispatchEvent(new Event('change'));
  document.querySelector('#runs tr[data-run="{ticked}"] input.compare').click();
  document.getElementById('pareto-itl').emit('plotly_click', {{points: [{{customdata: '{clicked}'}}]}});
}}, 0); }});
</script></body>"""
    scripted = tmp_path / "person.html"
    scripted.write_text(open(page, encoding="utf-8").read().replace("</body>", person, 1))
    status, dom = load(str(scripted))
    assert status["stat"] == "p99" and status["compared"] == 2
    by_key = {str(r["id"]): r for r in shown}
    check_counts(status, shown, "p99", everything=ok_results(db), compared=[by_key[ticked], by_key[clicked]])
    table = re.search(r'<table class="compare">(.*?)</table>', dom, re.S).group(1)
    by_id = {str(r["id"]): r["serve_command"] for r in shown}
    assert re.findall(r'<code class="command">(.*?)</code>', table) == [by_id[ticked], by_id[clicked]]


def test_shipped_database(tmp_path):
    """The database shipped with llmkern (real sweeps): the page a user opens without --db."""
    from llmkern.optimize.db import default_db_path

    db = default_db_path()
    if not os.path.exists(db):
        pytest.skip("no runs database is shipped in this build")
    page = str(tmp_path / "shipped.html")
    assert cli.main(["explore", "--out", page]) == 0
    results = ok_results(db)
    assert results, "the shipped database holds no successful runs"
    status, _ = load(page)
    check_counts(status, results)
