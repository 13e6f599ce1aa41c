"""llmkern estimate: the cost model and the schedule replay against cases worked out by hand."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.models.config import ModelConfig  # noqa: E402
from llmkern.optimize.estimate import (EngineKnobs, ModelShape, SimRequest, concurrency_estimate, simulate,
                                       step_time)
from llmkern.optimize.profiles import DATASHEETS, HardwareProfile, load, save

# hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads of 16, vocab 100
CFG = ModelConfig(arch="llama", vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16)


def _hw(**kw):
    base = dict(name="t", device="cpu", calibrated=True, bandwidth=1e9, gemm_flops={"float32": 1e9},
                attn_decode_bw=1e9, attn_prefill_flops=1e9, memory_gb=1.0, step_overhead_s=0.0, seq_overhead_s=0.0)
    base.update(kw)
    return HardwareProfile(**base)


def test_model_shape_by_hand():
    m = ModelShape.from_config(CFG)
    # per layer: q 64*64 + o 64*64 + k,v 64*32 each = 12288; MLP 3*64*128 = 24576 -> 36864; x2 layers
    assert m.linear_params == 73728
    assert m.head_params == 6400
    assert m.weight_bytes == (73728 + 6400) * 4
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4          # K and V, layers, kv heads, head dim, fp32
    assert ModelShape.from_config(CFG, "bfloat16").weight_bytes == (73728 + 6400) * 2
    with pytest.raises(ValueError, match="dtype"):
        ModelShape.from_config(CFG, "int3")


def test_step_time_by_hand():
    m = ModelShape.from_config(CFG)
    hw = _hw(step_overhead_s=1e-3, seq_overhead_s=1e-4)
    # two decodes at contexts 9 and 19: weights 320512 B / 1e9 vs 2*73728*2 FLOP / 1e9 -> the weight read
    c = step_time(m, hw, [9, 19], [])
    assert c.overhead == pytest.approx(1e-3 + 2e-4)
    assert c.linear == pytest.approx(320512 / 1e9 + 2 * 6400 * 2 / 1e9)
    assert c.attention == pytest.approx(512 * (10 + 20) / 1e9)
    # one 100-token prefill chunk over 50 cached tokens that finishes its prompt: compute bound
    c = step_time(m, hw, [], [(100, 50)], sampling_prefills=1)
    assert c.linear == pytest.approx(2 * 73728 * 100 / 1e9 + 2 * 6400 / 1e9)
    assert c.attention == pytest.approx(4 * 4 * 16 * 100 * (50 + 101 / 2) * 2 / 1e9)
    assert step_time(m, hw, [], []).total == 0.0


def _const_hw():
    """Step time = 10 ms whatever the batch: weights dominate, everything else is free."""
    m = ModelShape.from_config(CFG)
    return m, _hw(bandwidth=m.weight_bytes / 0.01, gemm_flops={"float32": 1e30}, attn_decode_bw=1e30,
                  attn_prefill_flops=1e30)


def test_simulate_one_request():
    m, hw = _const_hw()
    r = simulate([SimRequest(0.0, 20, 5)], m, hw, EngineKnobs())
    assert r["ttft_median"] == pytest.approx(0.01)              # one prefill step gives the first token
    assert r["itl_median"] == pytest.approx(0.01) and r["itl_p99"] == pytest.approx(0.01)
    assert r["e2e_latency_median"] == pytest.approx(0.05)       # 1 prefill + 4 decode steps
    assert r["output_throughput"] == pytest.approx(5 / 0.05)
    assert r["steps"] == 5


def test_simulate_chunked_prefill_and_sequence_cap():
    m, hw = _const_hw()
    r = simulate([SimRequest(0.0, 100, 2)], m, hw, EngineKnobs(max_num_batched_tokens=30))
    assert r["ttft_median"] == pytest.approx(0.04)              # ceil(100 / 30) = 4 chunks
    # without chunking the whole prompt is one step
    r = simulate([SimRequest(0.0, 100, 2)], m, hw, EngineKnobs(max_num_batched_tokens=30, enable_chunked_prefill=False))
    assert r["ttft_median"] == pytest.approx(0.01)
    # max_num_seqs=1: the second request starts when the first finishes (3 steps), then 1 prefill step
    r = simulate([SimRequest(0.0, 10, 3), SimRequest(0.0, 10, 3)], m, hw, EngineKnobs(max_num_seqs=1))
    assert [x["ttft"] for x in r["requests"]] == pytest.approx([0.01, 0.04])
    # max_num_seqs=2: both in the first step (budget allows), decode together
    r = simulate([SimRequest(0.0, 10, 3), SimRequest(0.0, 10, 3)], m, hw, EngineKnobs(max_num_seqs=2))
    assert [x["ttft"] for x in r["requests"]] == pytest.approx([0.01, 0.01])
    assert r["duration"] == pytest.approx(0.03)


def test_simulate_arrivals_and_client_concurrency():
    m, hw = _const_hw()
    # a request arriving while idle starts at its arrival
    r = simulate([SimRequest(1.0, 10, 2)], m, hw, EngineKnobs())
    assert r["requests"][0]["ttft"] == pytest.approx(0.01) and r["duration"] == pytest.approx(0.02)
    # closed loop with one client: the next request is sent when the previous one finishes
    r = simulate([SimRequest(0.0, 10, 2)] * 3, m, hw, EngineKnobs(max_concurrency=1))
    assert [x["ttft"] for x in r["requests"]] == pytest.approx([0.01] * 3)
    assert r["duration"] == pytest.approx(0.06)


def test_simulate_prefix_cache_saves_prefill_work():
    m = ModelShape.from_config(CFG)
    hw = _hw(bandwidth=1e30, attn_decode_bw=1e30, attn_prefill_flops=1e30)   # prefill time ~ tokens computed
    reqs = [SimRequest(0.0, 100, 1, "p", 64), SimRequest(10.0, 100, 1, "p", 64)]
    on = simulate(reqs, m, hw, EngineKnobs(block_size=16))
    off = simulate(reqs, m, hw, EngineKnobs(block_size=16, enable_prefix_caching=False))
    t_tok = 2 * m.linear_params / 1e9
    head = 2 * m.head_params / 1e9
    assert on["requests"][1]["ttft"] == pytest.approx((100 - 64) * t_tok + head)
    assert off["requests"][1]["ttft"] == pytest.approx(100 * t_tok + head)


def test_concurrency_estimate_limits():
    m, hw = _const_hw()
    e = concurrency_estimate(m, hw, 4, 10, 3, EngineKnobs(), kv_cache_memory_gb=1.0)
    assert e["limits"]["kv_memory_concurrency"] == int(2**30 // m.kv_bytes_per_token) // 13
    # 4 clients x 2 rounds: every round is 1 prefill step + 2 decode steps of the 4 together
    at = e["at_concurrency"]
    assert at["ttft_median"] == pytest.approx(0.01) and at["itl_median"] == pytest.approx(0.01)
    assert at["output_throughput"] == pytest.approx(16 * 3 / 0.12)
    assert e["decode_step_time"] == pytest.approx(0.01)
    with pytest.raises(ValueError):
        concurrency_estimate(m, hw, 0, 10, 3)


def test_profiles_save_load(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMKERN_PROFILE_DIR", str(tmp_path))
    p = _hw(name="mine")
    save(p)
    assert load("mine") == p
    assert not load("H200").calibrated and load("H200").bandwidth == 4.8e12
    assert set(DATASHEETS) == {"H100", "H200", "A100", "A100-40GB", "L40S"}
    with pytest.raises(ValueError, match="'nope'"):
        load("nope")


def _cli(capsys, *args, streams=False):
    """(the error a failing `llmkern estimate ARGS` exits with, or None; its stdout, or with
    streams=True capsys's captured stdout and stderr)."""
    from llmkern.cli import main

    try:
        rc = main(["estimate", *args])
    except SystemExit as e:
        return str(e.code), ""
    assert rc == 0
    out = capsys.readouterr()
    return None, out if streams else out.out


def test_cli_estimate(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "vocab_size": 100}))
    err, out = _cli(capsys, "--model", str(tmp_path), "--profile", "H100", "--concurrency", "8", "--json")
    assert err is None
    est = json.loads(out)
    assert est["profile"]["calibrated"] is False and est["at_concurrency"]["concurrency"] == 8
    err, out = _cli(capsys, "--model", str(tmp_path), "--profile", "L40S")
    assert err is None and "UNCALIBRATED" in out
    monkeypatch.setenv("LLMKERN_PROFILE_DIR", str(tmp_path / "empty"))
    err, _ = _cli(capsys, "--model", str(tmp_path), "--profile", "nope")
    assert err.startswith("llmkern: estimate:") and "--calibrate" in err
    err, _ = _cli(capsys, "--model", str(tmp_path), "--profile", "H100", "--concurrency", "0")
    assert "--concurrency" in err
    err, _ = _cli(capsys, "--model", str(tmp_path / "missing"), "--profile", "H100")
    assert "--model" in err and "missing" in err


def test_median_of_probes():
    from llmkern.optimize.profiles import median_of

    ps = [_hw(bandwidth=b, gemm_flops={"float32": g}, attn_decode_bw=b, step_overhead_s=o)
          for b, g, o in ((1e9, 5e9, 0.1), (9e9, 1e9, 0.2), (2e9, 3e9, 0.3))]
    m = median_of(ps)
    assert m.bandwidth == 2e9 and m.attn_decode_bw == 2e9 and m.gemm_flops == {"float32": 3e9}
    assert m.step_overhead_s == 0.3          # not a probed rate: the last profile's
