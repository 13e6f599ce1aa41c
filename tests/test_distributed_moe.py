"""Expert parallelism (and tensor parallelism splitting the experts) gives the single-process
engine's greedy tokens on tiny random Mixtral and Qwen2-MoE checkpoints, under the model-parallel
tests' workload (prefix-cache hits, preemption, chunked prefill, n-gram speculation); each rank is
its own process on loopback with one thread. The all-to-all volume computed from each rank's
routing equals what the collectives measured."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
pytest.importorskip("transformers", reason="the tiny checkpoints are made with HF transformers")

from llmkern import LLM, SamplingParams

from distributed_helpers import PROMPTS, engine_kwargs, one_thread, worker_children
from moe_helpers import tiny_moe_model

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# Mixtral: 8 experts, 4 per rank; Qwen2-MoE: 6 experts, 3 per rank, shared expert and a dense layer
FAMILIES = ("mixtral", "qwen2_moe")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_dist")
    out = {}
    for fam in FAMILIES:
        out[fam] = str(root / fam)
        tiny_moe_model(out[fam], fam)
    return out


@pytest.fixture(scope="module")
def reference(models):
    out = {}
    with one_thread():
        for fam, path in models.items():
            llm = LLM(path, **engine_kwargs("qwen2"))  # preemption by recompute
            out[fam] = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
            m = llm.run_metrics()
            assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0 and m["speculative"]["draft_tokens"] > 0
    return out


CASES = [("mixtral", dict(expert_parallel_size=2)), ("qwen2_moe", dict(expert_parallel_size=2)),
         ("qwen2_moe", dict(tensor_parallel_size=2))]


@pytest.mark.parametrize("fam,kw", CASES, ids=[f"{f}-{'EP' if 'expert_parallel_size' in k else 'TP'}2" for f, k in CASES])
def test_greedy_tokens_identical(fam, kw, models, reference):
    llm = LLM(models[fam], distributed_timeout_s=120, **kw, **engine_kwargs("qwen2"))
    try:
        assert len(worker_children()) == 1
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == reference[fam]
        m = llm.run_metrics()
        assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0
        pool = llm.engine.kv.pool
        assert pool.num_used == 0 and pool.num_free == pool.num_blocks
        stats = llm.engine.executor.stats()
        if "expert_parallel_size" in kw:
            moe = [s["moe"] for s in stats]
            sparse = sum(L.moe is not None for L in llm.engine.model.layers)
            steps = stats[0]["steps"]
            assert steps > 0 and all(s["steps"] == steps for s in stats)
            assert all(x["layer_calls"] == steps * sparse for x in moe)
            measured = sum(s["comm"]["bytes"]["a2a_dispatch"] + s["comm"]["bytes"]["a2a_combine"] for s in stats)
            assert measured == sum(x["a2a_bytes_computed"] for x in moe) > 0
        else:
            assert all("moe" not in s for s in stats)
    finally:
        llm.shutdown()
    assert worker_children() == []


def test_bad_expert_parallel_sizes(models, tmp_path):
    with pytest.raises(ValueError, match="expert_parallel_size: 2 must equal tensor_parallel_size 4"):
        LLM(models["mixtral"], expert_parallel_size=2, tensor_parallel_size=4)
    with pytest.raises(ValueError, match="expert_parallel_size: 4 does not divide the model's 6 experts"):
        LLM(models["qwen2_moe"], expert_parallel_size=4)
    from runtime_helpers import tiny_hf_model

    tiny_hf_model(str(tmp_path / "dense"), "llama")
    with pytest.raises(ValueError, match=r"expert_parallel_size: 2, but the model \(llama\) has no experts"):
        LLM(str(tmp_path / "dense"), expert_parallel_size=2)
    assert worker_children() == []


@pytest.mark.parametrize("argv, needle", [
    (["-ep", "0"], "--expert-parallel-size: expected an integer >= 1"),
    (["-ep", "2", "-tp", "4"], "--expert-parallel-size: 2 must equal tensor_parallel_size 4"),
    (["-ep", "4"], "--expert-parallel-size: 4 does not divide the model's 6 experts"),
])
def test_cli_expert_parallel_errors_are_one_line(argv, needle, models):
    from llmkern import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--model", models["qwen2_moe"], *argv, "hello"])
    msg = e.value.code
    assert isinstance(msg, str) and "\n" not in msg.strip() and needle in msg, msg
    assert worker_children() == []
