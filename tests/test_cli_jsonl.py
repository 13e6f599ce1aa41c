"""`llmkern generate --input`: every bad line (invalid UTF-8, bad or absurdly nested JSON, wrong
field types) is reported with its line number while the rest run; a UTF-8 BOM is accepted; results
are written as they finish, so a failure mid-run keeps the finished ones; a per-request problem such
as a top_k above the vocabulary stays with its request."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams, cli

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def run(tmp_path, model_dir, raw: bytes, *extra):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(raw)
    rc = cli.main(["generate", "--model", str(model_dir), "--load-format", "dummy", "--input", str(inp),
                   "--output", str(out), "--ignore-eos", "--kv-cache-memory-gb", "0.01", "--block-size", "4",
                   "--max-tokens", "3", *extra])
    res = {r["line"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    return rc, res


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def test_bad_lines_reported_by_number_rest_kept(tmp_path, model_dir, capsys):
    raw = (b"\xef\xbb\xbf" + line({"prompt_token_ids": [5, 6, 7], "id": "first"})   # 1: BOM accepted
           + b'{"prompt_token_ids": [5, 6], "x": "\xff\xfe"}\n'                      # 2: invalid UTF-8
           + b"[" * 100000 + b"\n"                                                    # 3: nested too deep
           + line({"prompt_token_ids": "abc"})                                        # 4: not a list
           + line({"messages": "hello"})                                              # 5: not a list
           + line({"prompt_token_ids": [5, True]})                                    # 6: bool is no id
           + line({"messages": [1, 2]})                                               # 7: not messages
           + line({"prompt_token_ids": [8], "sampling_params": 3})                    # 8
           + line({"prompt_token_ids": [9, 10], "max_tokens": 2}))                    # 9
    rc, res = run(tmp_path, model_dir, raw)
    assert rc == 1
    assert sorted(res) == list(range(1, 10))
    assert res[1]["id"] == "first" and len(res[1]["token_ids"]) == 3
    assert len(res[9]["token_ids"]) == 2
    assert "not valid UTF-8" in res[2]["error"]
    assert "nested too deeply" in res[3]["error"]
    assert "'prompt_token_ids' must be a list of integers" in res[4]["error"]
    assert "'messages' must be a non-empty list" in res[5]["error"]
    assert "'prompt_token_ids' must be a list of integers" in res[6]["error"]
    assert "'messages' must be a non-empty list" in res[7]["error"]
    assert "'sampling_params' must be an object" in res[8]["error"]
    err = capsys.readouterr().err
    for n in range(2, 9):
        assert f"in.jsonl:{n}: skipped" in err
    assert "7 bad line(s)" in err and "Traceback" not in err


def test_engine_rejects_wrong_prompt_types():
    llm = LLM(dict(TINY), load_format="dummy", num_gpu_blocks=16, block_size=4)
    outs = llm.generate([{"prompt_token_ids": "abc"}, {"messages": "hello"}, {"prompt": [5, 6]},
                         {"messages": [5, 6]}, {"prompt_token_ids": [5, 6]}],
                        SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert outs[0].error.startswith("prompt_token_ids: expected a list of token ids, got str")
    assert outs[1].error.startswith("messages: expected a non-empty list")
    assert outs[2].error.startswith("prompt: expected a string, got list")
    assert outs[3].error.startswith("messages: expected a non-empty list")
    assert outs[4].error is None and len(outs[4].token_ids) == 2


def test_results_written_as_they_finish(tmp_path, model_dir, monkeypatch, capsys):
    """The engine fails after the first request finished: that result is on disk, the others carry
    the error, nothing is lost silently and no traceback reaches the user."""
    from llmkern.engine.engine import Engine

    real_step = Engine.step
    finished = []

    def step(self):
        if finished:
            raise RuntimeError("simulated kernel failure")
        outs = real_step(self)
        finished.extend(o for o in outs if o.finished)
        return outs

    monkeypatch.setattr(Engine, "step", step)
    raw = line({"prompt_token_ids": [5], "max_tokens": 1}) + b"".join(
        line({"prompt_token_ids": [5, 6, 7], "max_tokens": 30}) for _ in range(3))
    rc, res = run(tmp_path, model_dir, raw)
    assert rc == 1 and sorted(res) == [1, 2, 3, 4]
    assert len(res[1]["token_ids"]) == 1 and "error" not in res[1]
    for n in (2, 3, 4):
        assert "generation failed: RuntimeError: simulated kernel failure" in res[n]["error"]
    assert "Traceback" not in capsys.readouterr().err


def test_top_k_above_vocab_is_clamped(tmp_path, model_dir):
    """vLLM clamps top_k to the vocabulary: the same draws as no top-k at all, in the batch and alone."""
    llm = LLM(dict(TINY), load_format="dummy", num_gpu_blocks=32, block_size=4)
    prompts = [[5, 6, 7], [8, 9]]
    huge = SamplingParams(temperature=1.0, top_k=10 ** 6, max_tokens=6, seed=3, ignore_eos=True)
    off = SamplingParams(temperature=1.0, top_k=0, max_tokens=6, seed=3, ignore_eos=True)
    a = llm.generate(prompts, [huge, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)], use_tqdm=False)
    b = llm.generate(prompts[:1], off, use_tqdm=False)
    assert a[0].error is None and a[0].token_ids == b[0].token_ids
    huge_p = SamplingParams(temperature=1.0, top_k=10 ** 12, top_p=0.9, max_tokens=6, seed=4, ignore_eos=True)
    off_p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=6, seed=4, ignore_eos=True)
    assert llm.generate(prompts[1:], huge_p, use_tqdm=False)[0].token_ids == \
        llm.generate(prompts[1:], off_p, use_tqdm=False)[0].token_ids
    rc, res = run(tmp_path, model_dir, line({"prompt_token_ids": [5, 6], "top_k": 10 ** 6, "temperature": 1.0})
                  + line({"prompt_token_ids": [7]}))
    assert rc == 0 and len(res[1]["token_ids"]) == 3 and len(res[2]["token_ids"]) == 3
