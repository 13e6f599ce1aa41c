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


# Qwen2-MoE x 2 pipeline stages: layers 0 (sparse) and 1 (dense) on the first, 2 (sparse) on the second
CASES = {"mixtral-EP2": ("mixtral", dict(expert_parallel_size=2)),
         "qwen2_moe-EP2": ("qwen2_moe", dict(expert_parallel_size=2)),
         "qwen2_moe-TP2": ("qwen2_moe", dict(tensor_parallel_size=2)),
         "qwen2_moe-EP2xPP2": ("qwen2_moe", dict(expert_parallel_size=2, pipeline_parallel_size=2))}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_identical(case, models, reference):
    fam, kw = CASES[case]
    llm = LLM(models[fam], distributed_timeout_s=120, **kw, **engine_kwargs("qwen2"))
    try:
        assert len(worker_children()) == 2 * kw.get("pipeline_parallel_size", 1) - 1
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == reference[fam]
        m = llm.run_metrics()
        assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0
        pool = llm.engine.kv.pool
        assert pool.num_used == 0 and pool.num_free == pool.num_blocks
        stats = llm.engine.executor.stats()
        if "expert_parallel_size" in kw:
            moe = [s["moe"] for s in stats]
            steps = stats[0]["steps"]
            assert steps > 0 and all(s["steps"] == steps for s in stats)
            # each rank runs every sparse layer of its stage once per step
            topo = llm.engine.executor.topo
            for r, x in enumerate(moe):
                first, end = topo.layers(topo.stage_of(r))
                sparse = sum(llm.engine.model_config.is_moe_layer(i) for i in range(first, end))
                assert x["layer_calls"] == steps * sparse
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
