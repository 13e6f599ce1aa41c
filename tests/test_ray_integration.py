"""Ray Data integration on a local Ray instance limited to 2 CPUs: `llmkern generate --ray` and
`llmkern embed --ray` write what the single-process job writes, and the documented map_batches
recipe (read_json -> LLMPredictor -> rows) gives the same results. Ray's processes are shut down in
teardown."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import cli
from runtime_helpers import tiny_hf_model

if os.environ.get("LLMKERN_REQUIRE_RAY") == "1":
    import ray  # CI installs it: a missing Ray is a failure there
else:
    ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ray") / "m")
    tiny_hf_model(path, "llama")
    return path


def _gen_lines(n=14):
    lines = [json.dumps({"prompt_token_ids": [5 + i % 4, 6, 7, 8] * (1 + i % 3), "max_tokens": 3 + i % 5,
                         "id": f"r{i}"}) for i in range(n)]
    lines.insert(4, "{bad json")
    return lines


def _common(model, generate=True):
    return ["--model", model, "--kv-cache-memory-gb", "0.01", "-q"] + (["--ignore-eos"] if generate else [])


def test_generate_on_ray_equals_local_job(ray_local, model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(_gen_lines()) + "\n")
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert cli.main(["generate", "--input", str(inp), "--output", str(local)] + _common(model)) == 1
    assert cli.main(["generate", "--input", str(inp), "--output", str(remote), "--ray", "--ray-actors", "2",
                     "--ray-batch-size", "4"] + _common(model)) == 1
    assert remote.read_bytes() == local.read_bytes()
    # Resume on Ray: drop some results (as if it had been killed), run again, same file.
    recs = remote.read_text().splitlines()
    remote.write_text("\n".join(recs[::2]) + "\n")
    assert cli.main(["generate", "--input", str(inp), "--output", str(remote), "--ray", "--resume"]
                    + _common(model)) == 1
    assert remote.read_bytes() == local.read_bytes()


def test_embed_on_ray_equals_local_job(ray_local, model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt_token_ids": [3 + (i * 5 + j) % 250 for j in range(2 + i)]})
                           + "\n" for i in range(10)))
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert cli.main(["embed", "--input", str(inp), "--output", str(local)] + _common(model, False)) == 0
    assert cli.main(["embed", "--input", str(inp), "--output", str(remote), "--ray", "--ray-actors", "2",
                     "--ray-batch-size", "3"] + _common(model, False)) == 0
    a = [json.loads(x) for x in local.read_text().splitlines()]
    b = [json.loads(x) for x in remote.read_text().splitlines()]
    assert [(r["line"], r["id"]) for r in a] == [(r["line"], r["id"]) for r in b]
    for x, y in zip(a, b):
        assert x["embedding"] == pytest.approx(y["embedding"], abs=1e-5)


def test_map_batches_recipe(ray_local, model, tmp_path):
    from llmkern.integrations.ray import LLMPredictor

    rows = [{"id": f"r{i}", "prompt_token_ids": [5 + i % 4, 6, 7, 8] * (1 + i % 3), "max_tokens": 3 + i % 5}
            for i in range(8)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    local = tmp_path / "local.jsonl"
    assert cli.main(["generate", "--input", str(inp), "--output", str(local)] + _common(model)) == 0
    ref = {json.loads(x)["id"]: json.loads(x) for x in local.read_text().splitlines()}

    ds = ray.data.read_json(str(inp))
    ds = ds.map_batches(LLMPredictor, batch_size=4, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1,
                        fn_constructor_kwargs=dict(task="generate", model=model,
                                                   sampling={"ignore_eos": True, "temperature": 0},
                                                   engine_kwargs={"kv_cache_memory_gb": 0.01}))
    out = ds.take_all()
    assert len(out) == len(rows)
    for r in out:
        rec = json.loads(r["record"])
        assert r["error"] is None
        assert rec["token_ids"] == ref[rec["id"]]["token_ids"]
        assert json.loads(r["id"]) == rec["id"]
