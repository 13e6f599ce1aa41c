"""llmkern estimate with tensor / pipeline / data parallelism: the per-rank step cost, the collectives
and the split search, against cases worked out by hand; and an answer on a fresh install."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.models.config import ModelConfig  # noqa: E402
from llmkern.optimize.estimate import EngineKnobs, ModelShape, SimRequest, concurrency_estimate, simulate, step_time
from llmkern.optimize.grammar import parse_constraints
from llmkern.optimize.parallel import Split, allreduce_time, splits
from llmkern.optimize.profiles import DATASHEETS, HardwareProfile
from llmkern.optimize.split_search import search
from test_estimate import _cli

# hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads of 16, vocab 100 (test_estimate.py's)
CFG = ModelConfig(arch="llama", vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16)
M = ModelShape.from_config(CFG)      # linear params 73728, head 6400, fp32


def _hw(**kw):
    # devices of their own (a GPU's): a rank's rates are the whole profile's
    base = dict(name="t", device="cuda", calibrated=True, bandwidth=1e9, gemm_flops={"float32": 1e9},
                attn_decode_bw=1e9, attn_prefill_flops=1e9, memory_gb=1.0, link_bw=1e8, link_latency_s=1e-5)
    base.update(kw)
    return HardwareProfile(**base)


def test_collectives_by_hand():
    # ring all-reduce over 4 ranks: 2 * 3/4 of the bytes each way, 6 latency-bound steps
    assert allreduce_time(1e6, 4, 1e9, 1e-5) == pytest.approx(1.5e-3 + 6e-5)
    assert allreduce_time(1e6, 1, 1e9, 1e-5) == 0.0
    assert _hw(link_bw=0.0).link == (1e9 / 4, 1e-5)          # no link figure: a quarter of the bandwidth


def test_tensor_parallel_decode_by_hand():
    hw = _hw()
    c = step_time(M, hw, [9], [], split=Split(tp=2))
    # each rank reads half of every matmul and of the LM head; one row of the head
    assert c.linear == pytest.approx((73728 / 2 + 6400 / 2) * 4 / 1e9 + 2 * 6400 / 2 / 1e9)
    # one KV head of two per rank, contexts 10
    assert c.attention == pytest.approx(512 / 2 * 10 / 1e9)
    # two all-reduces of one token's 64 fp32 activations per layer, 2 layers, 2 ranks
    assert c.comm == pytest.approx(2 * 2 * (2 * 1 / 2 * 256 / 1e8 + 2 * 1e-5))
    # tp beyond the KV heads: each rank keeps one whole head
    assert step_time(M, hw, [9], [], split=Split(tp=4)).attention == pytest.approx(512 / 2 * 10 / 1e9)


def test_pipeline_parallel_by_hand():
    hw = _hw(bandwidth=1e12)                     # compute bound: the matmuls decide
    # one sequence cannot be split: it crosses both stages one after the other
    one = step_time(M, hw, [], [(100, 0)], 1, Split(pp=2))
    assert one.linear == pytest.approx(2 * (2 * 73728 / 2 * 100 / 1e9 + 2 * 6400 / 1e9))
    assert one.comm == pytest.approx(2 * (100 * 64 * 4 / 1e8 + 1e-5))
    # four decodes: two micro-batches of two, each stage busy with one of them in turn
    four = step_time(M, hw, [9, 9, 9, 9], [], 0, Split(pp=2))
    # per slot: a quarter of the layers' matmul work (half the layers, half the tokens) + 2 head rows
    assert four.linear == pytest.approx(2 * (2 * 73728 * 4 / 4 / 1e9 + 2 * 6400 * 2 / 1e9))
    single = step_time(M, hw, [9, 9, 9, 9], [])
    assert four.linear < single.linear          # the layers' work is shared by the stages


def test_ranks_on_one_cpu_share_it_by_hand():
    """On a CPU the ranks are processes of one machine: each computes on its share of the cores, and
    the ranks at work at once share the memory bandwidth."""
    hw = _hw(device="cpu")
    c = step_time(M, hw, [9], [], split=Split(tp=2))
    # both ranks read at once: half the bandwidth each; half the GEMM rate each
    assert c.linear == pytest.approx((73728 / 2 + 6400 / 2) * 4 / 0.5e9 + 2 * 6400 / 2 / 0.5e9)
    assert c.attention == pytest.approx(512 / 2 * 10 / 0.5e9)
    # one sequence through two stages: one stage at work at a time, reading at the whole bandwidth
    one = step_time(M, hw, [9], [], split=Split(pp=2))
    assert one.linear == pytest.approx(2 * ((73728 / 2 + 6400) * 4 / 1e9 + 2 * 6400 / 0.5e9))
    # two micro-batches keep both stages busy: the bandwidth is shared again
    two = step_time(M, hw, [9, 9], [], split=Split(pp=2))
    assert two.linear == pytest.approx(2 * ((73728 / 2 + 6400) * 4 / 0.5e9 + 2 * 6400 / 0.5e9))
    # the engine's measured hand-over cost (stage_latency_s) replaces the link's for pipeline sends
    assert step_time(M, _hw(device="cpu", stage_latency_s=1e-3), [9], [], split=Split(pp=2)).comm == \
        pytest.approx(2 * (64 * 4 / 1e8 + 1e-3))


def test_data_parallel_replicas_are_independent():
    hw = _hw()
    reqs = [SimRequest(0.01 * i, 50, 8) for i in range(8)]
    two = simulate(reqs, M, hw, EngineKnobs(max_concurrency=8, split=Split(dp=2)))
    # replica r takes requests r, r + 2, ...: each is a one-engine run of its half at concurrency 4
    halves = [simulate(reqs[r::2], M, hw, EngineKnobs(max_concurrency=4)) for r in range(2)]
    assert two["ttft_median"] is not None
    assert sorted(x["ttft"] for x in two["requests"]) == pytest.approx(
        sorted(x["ttft"] for h in halves for x in h["requests"]))
    one = simulate(reqs, M, hw, EngineKnobs(max_concurrency=8))
    assert two["output_throughput"] > one["output_throughput"]


def test_splits_and_checks():
    assert [(s.tp, s.pp, s.dp) for s in splits(4, 4, 2, 2)] == [
        (1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert {s.tp for s in splits(9, 9, 3, 30)} == {1, 3, 9}
    assert "attention heads" in Split(tp=3).invalid(4, 2, 2)
    assert "exceeds the 2 layers" in Split(pp=4).invalid(4, 2, 2)
    with pytest.raises(ValueError, match="tp=3"):
        concurrency_estimate(M, _hw(), 2, 10, 4, EngineKnobs(split=Split(tp=3)))
    with pytest.raises(ValueError, match="num-gpus"):
        splits(0, 4, 2, 2)


def test_search_picks_the_fastest_split_meeting_the_slo():
    big = ModelShape(8192, 28672, 80, 64, 8, 128, 128256, "bfloat16")      # Llama-3-70B's shape
    h100 = DATASHEETS["H100"]
    res = search(big, h100, 8, 64, 1024, 256, EngineKnobs(), parse_constraints("itl:p95<60ms"))
    rows = {(r["tp"], r["pp"], r["dp"]): r for r in res["splits"]}
    assert not rows[(1, 1, 8)]["fits"] and "GiB per device" in rows[(1, 1, 8)]["why"]   # 140 GB of weights
    ok = [r for r in res["splits"] if r["fits"] and r["meets_slo"]]
    assert res["pick"] == max(ok, key=lambda r: r["output_throughput"])
    assert all(r["itl_p95"] < 0.06 for r in ok)
    none = search(big, h100, 8, 64, 1024, 256, EngineKnobs(), parse_constraints("itl:p95<1ms"))
    assert none["pick"] is None and none["closest"] is not None


def test_cli_parallel_and_fresh_install(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "vocab_size": 100}))
    err, out = _cli(capsys, "--model", str(tmp_path), "--profile", "A100", "-tp", "2", "-dp", "2", "--json",
                    streams=True)
    assert err is None and json.loads(out.out)["split"] == {"tp": 2, "pp": 1, "dp": 2, "devices": 4,
                                                             "weights_per_device_gb": pytest.approx(
                                                                 (73728 / 2 + 6400 / 2) * 2 / 2**30)}
    err, out = _cli(capsys, "--model", str(tmp_path), "--profile", "H100", "--num-gpus", "4",
                    "--slo", "ttft:p95<1s", streams=True)
    assert err is None and "pick: tp=" in out.out and "| 4 | 1 | 1 |" in out.out
    for bad, name in ((["--num-gpus", "0"], "--num-gpus"), (["-tp", "0"], "--tensor-parallel-size"),
                      (["--slo", "fast please"], "constraint"), (["-tp", "3"], "tp=3")):
        err, _ = _cli(capsys, "--model", str(tmp_path), "--profile", "H100", *bad)
        assert err is not None and name in err, (bad, err)
    # a fresh install: no saved profile, so the machine is measured now and the estimate answers
    monkeypatch.setenv("LLMKERN_PROFILE_DIR", str(tmp_path / "empty"))
    err, out = _cli(capsys, "--model", str(tmp_path), streams=True)
    assert err is None and "TTFT median" in out.out and "measuring it now" in out.err
    assert (tmp_path / "empty" / "cpu.json").is_file()


def test_cpu_link_is_measured_with_gloo():
    pytest.importorskip("torch.distributed")
    from llmkern.optimize.collectives import measure_link

    bw, lat = measure_link(timeout_s=120)
    # loopback between two processes: somewhere between a slow network and the memory bus
    assert 1e7 < bw < 1e12 and 1e-7 < lat < 0.1
