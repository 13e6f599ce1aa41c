"""Resumable offline jobs (`llmkern generate --input/--output`): a job killed with SIGKILL mid-run and
re-run with --resume ends with the same file as an uninterrupted run; results keyed by id; the
--resume / --overwrite choice; the final file in input order."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import cli
from runtime_helpers import tiny_hf_model

N = 40


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny") / "m")
    tiny_hf_model(path, "llama")
    return path


def _lines(n=N):
    out = []
    for i in range(n):
        toks = [3 + (i * 7 + j) % 200 for j in range(3 + i % 11)]
        d = {"prompt_token_ids": ([9, 8, 7, 6] * 5 if i % 3 == 0 else []) + toks, "max_tokens": 6 + i % 7}
        if i % 4:
            d["id"] = f"q{i}" if i % 2 else i * 10   # string and integer ids; every 4th line has none
        out.append(json.dumps(d))
    out.insert(17, "{not json")
    out.insert(30, json.dumps({"prompt_token_ids": [5, 6], "id": "q1"}))  # duplicate id
    return out


def _args(model, inp, out, *extra):
    return ["generate", "--model", model, "--input", str(inp), "--output", str(out), "--ignore-eos", "-q",
            "--kv-cache-memory-gb", "0.01", "--block-size", "4", "--max-num-seqs", "2", *extra]


def test_sigkill_then_resume_equals_uninterrupted(model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_lines()) + "\n")
    ref = tmp_path / "ref.jsonl"
    assert cli.main(_args(model, inp, ref)) == 1  # bad lines make the exit code 1
    ref_recs = [json.loads(x) for x in ref.read_text().splitlines()]
    assert [r["line"] for r in ref_recs] == list(range(1, N + 3))  # input order, one record per line
    assert sum("error" in r for r in ref_recs) == 2

    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "llmkern.cli"] + _args(model, inp, out)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.005)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    partial = out.read_bytes()
    n_done = partial.count(b"\n")
    assert 5 <= n_done < N + 2, "the job must have been killed mid-run"
    with open(out, "ab") as f:   # as if the kill had cut a write short
        f.write(b'{"line": 3, "id": "q3", "text": "")')

    # Without --resume or --overwrite the job refuses to touch the file.
    with pytest.raises(SystemExit, match="--resume"):
        cli.main(_args(model, inp, out))
    assert cli.main(_args(model, inp, out, "--resume")) == 1
    assert out.read_bytes() == ref.read_bytes()
    assert not os.path.exists(str(out) + ".tmp")

    # Resuming a finished job runs only the bad lines again (they fail again) and changes nothing.
    assert cli.main(_args(model, inp, out, "--resume")) == 1
    assert out.read_bytes() == ref.read_bytes()


def test_resume_matches_by_id_after_the_input_changed(model, tmp_path):
    lines = [json.dumps({"prompt_token_ids": [4 + i, 5, 6], "max_tokens": 6, "id": f"r{i}"}) for i in range(6)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines[:4]) + "\n")
    assert cli.main(_args(model, inp, out)) == 0
    first = {json.loads(x)["id"]: json.loads(x) for x in out.read_text().splitlines()}
    # New input: reordered, one line dropped, two added. Kept ids keep their result (moved to their
    # new line), the dropped id's result leaves the file, the new ids are run.
    new = [lines[5], lines[2], lines[0], lines[4], lines[1]]
    inp.write_text("\n".join(new) + "\n")
    assert cli.main(_args(model, inp, out, "--resume")) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["r5", "r2", "r0", "r4", "r1"]
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5]
    for r in recs:
        if r["id"] in first:
            assert r["token_ids"] == first[r["id"]]["token_ids"]
    fresh = tmp_path / "fresh.jsonl"
    assert cli.main(_args(model, inp, fresh)) == 0
    assert fresh.read_bytes() == out.read_bytes()
    assert cli.main(_args(model, inp, out, "--overwrite")) == 0   # starts over: the same file again
    assert out.read_bytes() == fresh.read_bytes()


def test_job_arguments_checked_before_work(model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_token_ids": [4, 5]}) + "\n")
    with pytest.raises(SystemExit, match="--input"):
        cli.main(_args(model, tmp_path / "missing.jsonl", tmp_path / "o.jsonl"))
    with pytest.raises(SystemExit, match="--output"):
        cli.main(_args(model, inp, tmp_path))
    with pytest.raises(SystemExit):   # argparse: not both
        cli.main(_args(model, inp, tmp_path / "o.jsonl", "--resume", "--overwrite"))
    with pytest.raises(SystemExit, match="--price-per-hour"):
        cli.main(_args(model, inp, tmp_path / "o.jsonl", "--price-per-hour", "-1"))
    # A job that cannot start leaves existing results alone, even with --overwrite.
    kept = tmp_path / "kept.jsonl"
    kept.write_text('{"line": 1, "text": "earlier"}\n')
    with pytest.raises(SystemExit, match="does not exist"):
        cli.main(_args(str(tmp_path / "no-model"), inp, kept, "--overwrite"))
    assert kept.read_text() == '{"line": 1, "text": "earlier"}\n'


def test_summary_reports_cost(model, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_token_ids": [4, 5, i + 3], "max_tokens": 5}) + "\n" for i in range(4)))
    args = [a for a in _args(model, inp, out) if a != "-q"] + ["--price-per-hour", "3.6"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "per million tokens" in x][-1]
    # 4 lines x (3 prompt + 5 output) tokens = 32 tokens; $3.6/h = $0.001/s
    secs = float(line.split(" lines in ")[1].split(" s ")[0])
    cost = float(line.split("| $")[1].split(" per million")[0])
    # the printed time is rounded to 0.01 s: the cost must lie within what that rounding allows
    lo, hi = (0.001 * max(secs - 0.005, 0.0) / 32 * 1e6, 0.001 * (secs + 0.005) / 32 * 1e6)
    assert lo * 0.99 - 1e-4 <= cost <= hi * 1.01 + 1e-4
