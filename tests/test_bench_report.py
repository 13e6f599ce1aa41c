"""The benchmark report generator on a tiny run: synthetic records for every plot plus one real
(short) measurement of a cache op; JSON, Markdown and PNG files with the expected rows."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import llmkern

from llmkern.bench import common, report, suite
from llmkern.bench.common import Record

LIMITS = {"device": "cpu", "copy_bandwidth_Bps": 40e9, "read_bandwidth_Bps": 50e9, "matmul_float32_flops": 2e11}


def synthetic() -> list:
    recs = []
    for s in (512, 1024, 2048):
        recs.append(Record("attention/flash_attn_varlen_func", f"causal bf16 9/3x64 len {s}", 1e-6 * s, "torch SDPA",
                           1.5e-6 * s, "GFLOP/s", 50.0, 200.0, axes={"seqlen": s, "series": "causal bf16 9/3x64"}))
    for b in (4, 64):
        recs.append(Record("attention/flash_attn_with_kvcache", f"{b} seqs x 1k ctx bs16", 1e-4 * b, "torch gather + SDPA",
                           3e-3 * b, "GB/s", 20.0, 50.0, axes={"batch": b, "seqlen": 1024, "series": "1k ctx bs16"}))
    for b in (1, 16, 64):
        recs.append(Record("sampling/top_p_sampling_from_probs", f"{b}x49152 top-p 0.9", 1e-5 * b, "torch sort + multinomial",
                           1e-3 * b, "GB/s", 19.6, 50.0, {"headline": b == 64}, axes={"batch": b, "series": "top-p 0.9"}))
    for n in (32, 256):
        for peer, slower in (("HF generate (static, batch 16)", 3.5), ("HF generate_batch", 2.0)):
            recs.append(Record("e2e/offline", f"{n} requests SmolLM2 fp32", 0.1 * n, peer,
                               0.1 * slower * n, "tok/s", 700.0, None, axes={"requests": n, "series": "SmolLM2 fp32"}))
    return recs


def real_cache_op() -> Record:
    tokens, heads, hd, bs = 64, 2, 64, 16
    kc = torch.zeros(8, bs, heads, hd)
    vc = torch.zeros_like(kc)
    k, v = torch.randn(tokens, heads, hd), torch.randn(tokens, heads, hd)
    slots = torch.randperm(8 * bs)[:tokens]
    t, tp = common.timeit_pair(lambda: llmkern.reshape_and_cache_flash(k, v, kc, vc, slots),
                               lambda: (kc.view(-1, heads, hd).index_copy_(0, slots, k),
                                        vc.view(-1, heads, hd).index_copy_(0, slots, v)), min_time=0.02)
    torch.testing.assert_close(kc.view(-1, heads, hd)[slots], k)  # it did the work it was timed on
    moved = 2 * 2 * k.numel() * 4
    return Record("kvcache/reshape_and_cache_flash", f"{tokens}tok {heads}x{hd} fp32 bs{bs}", t,
                  "torch index_copy_", tp, "GB/s", moved / t / 1e9, LIMITS["copy_bandwidth_Bps"] / 1e9)


def result(records) -> dict:
    return {"suite": "all", "quick": True, "device": "cpu", "started": "now", "machine": suite.machine_info(),
            "limits": LIMITS, "records": records, "elapsed_s": 1.0,
            "modules": [{"name": "bench_cache_ops", "suite": "kernels", "status": "ok", "seconds": 0.1, "records": 1, "note": ""},
                        {"name": "bench_attention", "suite": "kernels", "status": "skipped", "seconds": 0.0, "records": 0,
                         "note": "bench_attention.py is not present in this build"}]}


def test_report_files_and_rows(tmp_path):
    pytest.importorskip("matplotlib")
    recs = synthetic() + [real_cache_op()]
    paths = report.write_report(result(recs), str(tmp_path))

    data = json.loads((tmp_path / "results.json").read_text())
    assert [(r["bench"], r["case"]) for r in data["records"]] == [(r.bench, r.case) for r in recs]
    real = data["records"][-1]
    assert real["llmkern_s"] > 0 and real["peer_s"] > 0
    assert real["ratio"] == pytest.approx(real["peer_s"] / real["llmkern_s"])
    assert data["machine"]["simd"] == llmkern.build_info()["cpu_simd"]

    md = (tmp_path / "report.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("| `")]
    for r in recs:  # every record has a row in the full table, with its ratio
        assert any(f"`{r.bench}`" in ln and r.case in ln and f"{r.ratio:.2f}x" in ln for ln in table), r
    assert "## Headline" in md and "% of machine limit" in md
    headline = md.split("## Headline")[1].split("## All figures")[0]
    assert "64x49152 top-p 0.9" in headline and "1x49152" not in headline  # the marked case
    assert "not present in this build" in md

    expected = {"speedup.png", "attention_latency.png", "decode_bandwidth.png", "sampling_bandwidth.png", "e2e_throughput.png"}
    assert {os.path.basename(p) for p in paths["plots"]} == expected
    for fn in expected:
        assert (tmp_path / fn).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({fn})" in md


def test_missing_plot_data_is_a_note(tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.write_report(result([real_cache_op()]), str(tmp_path))
    assert [os.path.basename(p) for p in paths["plots"]] == ["speedup.png"]
    md = (tmp_path / "report.md").read_text()
    assert "Attention: latency vs sequence length: skipped" in md
    assert "End-to-end: output throughput vs request count: skipped" in md


def test_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    paths = report.write_report(result(synthetic()), str(tmp_path))
    assert paths["plots"] == [] and not list(tmp_path.glob("*.png"))
    assert report.MATPLOTLIB_NOTE in (tmp_path / "report.md").read_text()
    assert len(json.loads((tmp_path / "results.json").read_text())["records"]) == len(synthetic())


def test_suite_survives_missing_and_failing_modules(tmp_path, monkeypatch):
    (tmp_path / "bench_boom.py").write_text("def run(quick=False, device='cpu'):\n    raise RuntimeError('boom')\n")
    (tmp_path / "bench_fine.py").write_text(
        "from llmkern.bench.common import Record\n"
        "def run(quick=False, device='cpu'):\n    return [Record('x/fine', 'one', 1.0, 'peer', 2.0)]\n")
    (tmp_path / "bench_gpuonly.py").write_text("def run(quick=False, device='cpu'):\n    raise SystemExit('needs --device cuda')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(common._settings, "min_time", common._settings["min_time"])  # run_suite sets it
    res = suite.run_suite("kernels", quick=True, bench_dir=str(tmp_path), measure_limits=False, log=lambda s: None)
    status = {m["name"]: (m["status"], m["note"]) for m in res["modules"]}
    assert status["bench_attention"][0] == "skipped" and "not present" in status["bench_attention"][1]
    assert status["bench_boom"][0] == "error" and "boom" in status["bench_boom"][1]
    assert status["bench_fine"][0] == "ok"
    assert status["bench_gpuonly"] == ("skipped", "needs --device cuda")
    assert [r.bench for r in res["records"]] == ["x/fine"]
    assert [m for g, m in suite.select("e2e", bench_dir=str(tmp_path))] == suite.REGISTRY["e2e"]
    (tmp_path / "bench_spec_ngram.py").write_text("def run(quick=False, device='cpu'):\n    return []\n")
    (tmp_path / "bench_odd.py").write_text('SUITE = "e2e"\n')
    assert [m for g, m in suite.select("e2e", bench_dir=str(tmp_path))] == ["bench_e2e", "bench_odd", "bench_spec_ngram"]


def test_cli_rerenders_saved_json(tmp_path, capsys):
    from llmkern.cli import bench_suite as bench_cli

    report.write_report(result(synthetic()), str(tmp_path / "run"), plots=False)
    rc = bench_cli.main(["report", str(tmp_path / "run" / "results.json"), "--out", str(tmp_path / "again"), "--no-plots"])
    assert rc == 0
    md = (tmp_path / "again" / "report.md").read_text()
    assert "sampling/top_p_sampling_from_probs" in md and "64x49152 top-p 0.9" in md


@pytest.mark.parametrize("bench,case,axis,x", [
    ("attention/prefill causal", "bf16 1x2048 smollm2 9/3x64", "seqlen", 2048),
    ("attention/prefill causal", "b8 s512 h32/8 d128", "seqlen", 512),
    ("attention/paged decode", "bf16 64x1024 32/8x128 bs16", "batch", 64),
    ("attention/paged decode", "4 seqs x 16k ctx bs16", "batch", 4),
    ("attention/paged prefill", "bf16 512 over 4k 32/8x128 bs16", "seqlen", None),
    ("sampling/top-p 0.9", "64 x 49152", "batch", 64),
    ("sampling/plain", "rows=256 vocab=128k", "batch", 256),
    ("e2e/offline", "offline-32 SmolLM2 fp32", "requests", 32),
    ("e2e/offline", "256 requests", "requests", 256),
])
def test_legacy_axis_from_case_string(bench, case, axis, x):
    """Only records of results saved before Record.axes existed are placed by their case string."""
    assert report.axis_value(Record(bench, case, 1.0, "peer", 2.0), axis) == (None, None, None)
    got, label, panel = report.axis_value(Record(bench, case, 1.0, "peer", 2.0, extra={report.LEGACY: True}), axis)
    assert got == x
    if x is not None:
        assert label and str(x) not in label.split()


def test_end_to_end_records_as_the_runtime_writes_them(tmp_path):
    """Workload size in the bench name and in axes, "out tok/s", and a roofline fraction instead of a limit."""
    pytest.importorskip("matplotlib")
    axes = {"requests": 8, "panel": "e2e/offline", "series": ""}
    recs = [Record("e2e/offline-8", "HF generate static batch 16", 2.0, "hf-generate-static", 7.0, "out tok/s", 300.0,
                   None, {"roofline_fraction": 0.25}, axes),
            Record("e2e/offline-8", "HF generate_batch (continuous)", 2.0, "hf-generate_batch", 4.0, "out tok/s", 300.0,
                   None, {"roofline_fraction": 0.25}, axes),
            Record("e2e/prefix-8x1k", "TTFT p50 with vs without prefix caching", 0.01, "llmkern-no-prefix-cache", 0.08,
                   "ms TTFT", 10.0)]
    paths = report.write_report(result(recs), str(tmp_path))
    assert "e2e_throughput.png" in [os.path.basename(p) for p in paths["plots"]]
    assert report.axis_value(recs[0], "requests") == (8, "", "e2e/offline")
    md = (tmp_path / "report.md").read_text()
    assert "25% of the matmul roofline" in md and "**3.50x**" in md and "**8.00x**" in md


def test_device_check_summary_renders(tmp_path):
    """bench/device_check.sh writes summary.json with each module's records: same report."""
    recs = [r.as_dict() for r in synthetic()]
    summary = {"started": "2026-01-01 00:00:00", "duration_s": 300,
               "environment": {"python": "3.12", "torch": "2.11", "gpu": "NVIDIA H200", "capability": "9.0", "sms": 132,
                               "memory_gib": 139.8},
               "benchmarks": {"attention_gpu": recs[:3], "sampling": recs[5:8], "cache_ops": "unreadable (boom)"}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    res = report.load(str(tmp_path / "summary.json"))
    paths = report.write_report(res, str(tmp_path / "out"), plots=False)
    md = open(paths["markdown"]).read()
    assert "NVIDIA H200" in md and "`bench_cache_ops` | kernels | error" in md
    assert sum(ln.startswith("| `attention/") for ln in md.split("## All figures")[1].splitlines()) == 3


def test_axes_come_from_record_fields_not_case_names():
    """A case string that names other numbers (or none) does not move a record: the plot reads
    Record.axes, and a record without the plot's axis is left out rather than guessed."""
    spec = {p["file"]: p for p in report.PLOTS}["sampling_bandwidth.png"]
    recs = [Record("sampling/top_k", "batch 999 x 4096 rows 7", 1e-5, "torch topk", 2e-5, "GB/s", 10.0, 50.0,
                   axes={"batch": 8, "series": "vocab 4096"}),
            Record("sampling/top_k", "no numbers here", 1e-5, "torch topk", 2e-5, "GB/s", 12.0, 50.0,
                   axes={"batch": 32, "series": "vocab 4096", "panel": "sampling/top-k"}),
            Record("sampling/top_k", "64 x 4096", 1e-5, "torch topk", 2e-5, "GB/s", 11.0, 50.0)]
    curves, note = report._series(spec, recs)
    assert set(curves) == {("sampling/top_k", "vocab 4096"), ("sampling/top-k", "vocab 4096")}
    assert curves[("sampling/top_k", "vocab 4096")]["llmkern"] == {8.0: 10.0}
    assert curves[("sampling/top-k", "vocab 4096")]["llmkern"] == {32.0: 12.0}
    assert "1 of 3 records left out" in note  # "64 x 4096" is not parsed into a batch


def test_old_results_without_axes_still_plot(tmp_path):
    """results.json written before Record.axes existed: the report places its records as it did then."""
    old = [{k: v for k, v in r.as_dict().items() if k != "axes"} for r in synthetic()]
    for d in old:  # the old files said x in extra or only in the case string
        if d["bench"].startswith("attention/flash_attn_varlen"):
            d["extra"] = {"seqlen": int(d["case"].split()[-1])}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**result([]), "records": old}))
    recs = [report.as_record(d) for d in report.load(str(path))["records"]]
    spec = {p["file"]: p for p in report.PLOTS}["sampling_bandwidth.png"]
    curves, _ = report._series(spec, recs)
    assert sorted(x for c in curves.values() for x in c["llmkern"]) == [1.0, 16.0, 64.0]
    spec = {p["file"]: p for p in report.PLOTS}["attention_latency.png"]
    curves, _ = report._series(spec, recs)
    assert sorted(x for c in curves.values() for x in c["llmkern"]) == [512.0, 1024.0, 2048.0]
