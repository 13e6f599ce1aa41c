"""`llmkern` CLI mistakes a user makes: each is a one-line error naming the option, given before
any model is loaded where the mistake can be seen without the model; argparse reports unknown
options on the subcommand with a suggestion; help texts show defaults and list the bench commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from llmkern import cli

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the CLI gets as far as loading a model."""
    def boom(*a, **k):
        raise AssertionError("the model was loaded before the argument error was reported")

    monkeypatch.setattr("llmkern.engine.engine.load_model", boom)


@pytest.fixture
def tiny_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def one_line_error(argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    msg = e.value.code
    assert isinstance(msg, str), f"exit code {msg!r} instead of an error message"
    assert "\n" not in msg.strip() and msg.startswith("llmkern"), msg
    return msg


@pytest.mark.parametrize("argv, needle", [
    (["--max-tokens", "-1"], "--max-tokens:"),
    (["--top-p", "0"], "--top-p:"),
    (["--temperature", "-0.5"], "--temperature:"),
    (["--min-tokens", "9", "--max-tokens", "3"], "--min-tokens:"),
    (["--block-size", "0"], "--block-size:"),
    (["--kv-cache-memory-gb", "1e6"], "--kv-cache-memory-gb:"),
    (["--kv-cache-memory-gb", "nan"], "--kv-cache-memory-gb:"),
    (["--num-gpu-blocks-override", "-1"], "--num-gpu-blocks-override:"),
    (["--cpu-offload-gb", "1e9"], "--cpu-offload-gb:"),
    (["--device", "tpu"], "--device:"),
    (["--device", "meta"], "--device:"),
    (["--device", "gpu0"], "--device:"),
    (["--dtype", "int8"], "--dtype:"),
    (["--model", "/nonexistent/model.gguf"], "--model:"),
    (["--input", "/nonexistent/prompts.jsonl"], "--input:"),
])
def test_bad_arguments_rejected_before_loading(argv, needle, no_model_load):
    args = ["generate"] + argv + ([] if "--input" in argv else ["hello"])
    msg = one_line_error(args)
    assert needle in msg, msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_device_cuda_without_gpu_is_one_line(no_model_load):
    msg = one_line_error(["generate", "--device", "cuda", "hi"])
    assert "--device:" in msg and "no CUDA device is available" in msg
    with pytest.raises(ValueError, match="no CUDA device is available"):
        from llmkern import LLM

        LLM(dict(TINY), load_format="dummy", device="cuda")


def test_memory_request_checked_against_the_machine(no_model_load):
    from llmkern.kvcache.memory import host_available_bytes

    avail = host_available_bytes()
    assert avail and avail > 0
    msg = one_line_error(["generate", "--kv-cache-memory-gb", str(2 * avail / 2 ** 30), "hi"])
    assert "available" in msg and "GiB" in msg


def test_typo_flag_reported_by_the_subcommand_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--temprature", "0.5", "hi"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: llmkern generate" in err
    assert "unrecognized option --temprature (did you mean --temperature?)" in err
    with pytest.raises(SystemExit):
        cli.main(["bench", "throughput", "--no-pears"])
    err = capsys.readouterr().err
    assert "usage: llmkern bench throughput" in err and "did you mean --no-peers?" in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "--max-tokens MAX_TOKENS most tokens to generate per prompt (default: 256)" in flat
    assert "--block-size BLOCK_SIZE tokens per KV-cache block (default: 16)" in flat
    assert "(default: None)" not in flat and "(default: False)" not in flat


def test_bench_help_lists_throughput(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "throughput" in out and "kernels" in out and "report" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "throughput" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["bench", "throughput", "--help"])
    assert "--no-peers" in capsys.readouterr().out


def test_output_checked_before_generation(tmp_path, tiny_dir, no_model_load):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_token_ids": [5, 6]}) + "\n")
    base = ["generate", "--model", str(tiny_dir), "--load-format", "dummy", "--input", str(inp)]
    msg = one_line_error(base + ["--output", str(tmp_path / "no_such_dir" / "out.jsonl")])
    assert "--output:" in msg and "No such file or directory" in msg
    msg = one_line_error(base + ["--output", str(tmp_path)])
    assert "--output:" in msg and "is a directory" in msg


def _unwritable_path(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    for p in (ro / "out.jsonl", "/sys/llmkern-test-out.jsonl", "/proc/llmkern-test-out.jsonl"):
        try:
            with open(p, "a"):
                pass
        except OSError:
            return str(p)
        if os.path.exists(p) and str(p).startswith(str(tmp_path)):
            os.remove(p)
    return None


def test_output_read_only(tmp_path, tiny_dir, no_model_load):
    path = _unwritable_path(tmp_path)
    if path is None:
        pytest.skip("no unwritable path found for this user")
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt_token_ids": [5, 6]}) + "\n")
    msg = one_line_error(["generate", "--model", str(tiny_dir), "--load-format", "dummy", "--input", str(inp),
                          "--output", path])
    assert "--output:" in msg and "cannot write" in msg


def test_errors_reach_the_terminal_as_one_line():
    """The installed entry point: no traceback, one line, non-zero exit."""
    code = "import sys; from llmkern.cli import main; sys.exit(main())"
    for argv, needle in ((["generate", "--max-tokens", "-1", "hi"], "--max-tokens"),
                         (["generate", "--device", "tpu", "hi"], "--device")):
        r = subprocess.run([sys.executable, "-c", code] + argv, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
