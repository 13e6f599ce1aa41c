"""Arguments and entry points of `llmkern optimize` and `llmkern estimate` (wired in llmkern/cli.py)."""
from __future__ import annotations

import argparse
import json

from .workloads import BUILTINS


def add_optimize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--workload", default="chat", help=f"{', '.join(BUILTINS)}, or a JSONL file of "
                                                      "{\"prompt\", \"max_tokens\", [\"arrival\"]} requests")
    p.add_argument("--sweep", default="", help="e.g. \"max_num_seqs=[8,32];max_num_batched_tokens=range(256,4097,1024);"
                                               "speculative=[none,ngram:4]\"; paired keys: \"tp*dp=[(1,2),(2,1)]\"; "
                                               "client keys: request_rate, max_concurrency")
    p.add_argument("--constraints", default="", help="e.g. \"ttft:p95<500ms;itl:p95<50ms\" (ttft|itl|e2e_latency, "
                                                     "mean|median|p95|p99)")
    p.add_argument("--db", default=None, help="runs database (default: $LLMKERN_DB or ./llmkern-runs.sqlite)")
    p.add_argument("--continue", dest="resume", action="store_true",
                   help="resume the newest matching sweep in --db, skipping finished configurations")
    p.add_argument("--num-requests", type=int, default=None, help="requests in a built-in workload")
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrival rate, req/s")
    p.add_argument("--offline", action="store_true", help="run a JSONL workload in-process (all at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=None, help="passed to every configuration")
    p.add_argument("--kv-cache-memory-gb", type=float, default=None, help="passed to every configuration")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration's run")
    p.add_argument("--profile", default=None, help="hardware profile for the estimate (default: calibrate now)")
    p.add_argument("--recalibrate", action="store_true",
                   help="re-measure the machine before each configuration (a shared machine's rates drift); "
                        "each estimate uses the median of the measurements so far (without the calibration on the "
                        "model: --no-engine-calibration or another framework's server)")
    p.add_argument("--no-engine-calibration", action="store_true",
                   help="estimate with the machine profile alone (default: first measure this model's decode "
                        "in-process, and through `llmkern serve` for a serving workload, ~30 s)")
    p.add_argument("--retry-busy", type=int, default=1,
                   help="measure a configuration again (up to N times) when other work used more than a quarter of "
                        "the machine during its run; the load is recorded with every run either way")
    p.add_argument("--estimate-profile", dest="estimate_profiles", action="append", default=[],
                   help="also estimate every llmkern configuration on this hardware profile (H100, H200, A100, A100-40GB, L40S "
                        "datasheets or a saved profile; repeatable): shown next to the measured points, marked")
    p.add_argument("--machine-notes", default=None, help="free text stored with the machine description")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--framework", default="llmkern", choices=["llmkern", "vllm", "sglang"],
                   help="the server to sweep: llmkern's, vLLM's (`vllm serve`) or SGLang's, each with its own "
                        "flags for the knobs")
    p.add_argument("--vllm-exe", default=None, help="the vllm executable (default: $LLMKERN_VLLM_EXE, else on PATH)")
    p.add_argument("--sglang-python", default=None, help="a python that has sglang (default: this one)")
    p.add_argument("--max-model-len", type=int, default=2048, help="context length given to vLLM/SGLang servers")
    p.add_argument("--report", action="store_true",
                   help="run nothing: print the picks, Pareto fronts and estimate errors of every sweep in --db")


def run_optimize(a) -> int:
    from . import sweep

    if a.report:
        return sweep.report_only(a.db)
    for name in ("num_requests", "timeout", "request_rate", "kv_cache_memory_gb"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            raise ValueError(f"--{name.replace('_', '-')}: expected a number > 0, got {v}")
    if a.retry_busy < 0:
        raise ValueError(f"--retry-busy: expected an integer >= 0, got {a.retry_busy}")
    from . import profiles

    for name in a.estimate_profiles:   # unknown names fail before anything runs
        profiles.load(name, "--estimate-profile")
    return sweep.run(a)


def add_estimate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2)")
    p.add_argument("--profile", default=None, help="H100, H200, A100, A100-40GB, L40S (datasheet, uncalibrated), a saved "
                                                   "profile name or .json file (default: the saved 'cpu' profile)")
    p.add_argument("--calibrate", action="store_true", help="measure this machine now and save the profile")
    p.add_argument("--save-as", default="cpu", help="name of the profile --calibrate saves")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--input-len", type=int, default=256, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-memory-gb", type=float, default=None)
    par = p.add_argument_group("parallelism (optimize/parallel.py)")
    par.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    par.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    par.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    par.add_argument("--num-gpus", "--num-devices", dest="num_gpus", type=int, default=None,
                     help="estimate every tp x pp x dp split of this many devices and pick one under --slo")
    par.add_argument("--slo", default="", help="constraints for the pick, e.g. \"ttft:p95<500ms;itl:p95<50ms\"")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")


def _profile(a):
    """The hardware profile: --calibrate measures now, --profile names one, else the saved 'cpu'
    profile, measured now (a few seconds) and saved when there is none yet."""
    import sys

    from . import profiles

    if a.calibrate:
        hw = profiles.calibrate(a.save_as, quick=False)
        print(f"saved calibrated profile {a.save_as!r} to {profiles.save(hw)}")
        return hw
    if a.profile:
        return profiles.load(a.profile)
    try:
        return profiles.load("cpu")
    except ValueError:
        print("llmkern estimate: no profile of this machine yet; measuring it now (a few seconds, once; "
              "`llmkern estimate --calibrate` measures longer) ...", file=sys.stderr, flush=True)
        hw = profiles.calibrate("cpu", quick=True)
        print(f"llmkern estimate: saved it to {profiles.save(hw)}", file=sys.stderr, flush=True)
        return hw


def run_estimate(a) -> int:
    from .estimate import EngineKnobs, ModelShape, concurrency_estimate, model_config
    from .grammar import parse_constraints
    from .parallel import Split

    for name in ("concurrency", "input_len", "output_len", "max_num_seqs", "max_num_batched_tokens",
                 "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(a, name)}")
    constraints = parse_constraints(a.slo)
    hw = _profile(a)
    dtype = a.dtype or ("float32" if hw.device == "cpu" else "bfloat16")
    m = ModelShape.from_config(model_config(a.model), dtype).with_stored_weights(a.model)
    knobs = EngineKnobs(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                        split=Split(a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size))
    if a.num_gpus is not None:
        return _print_search(a, m, hw, knobs, constraints)
    est = concurrency_estimate(m, hw, a.concurrency, a.input_len, a.output_len, knobs, a.kv_cache_memory_gb)
    est["profile"] = {"name": hw.name, "calibrated": hw.calibrated, "notes": hw.notes}
    if a.json:
        print(json.dumps(est, indent=1))
        return 0
    c = est["at_concurrency"]
    lim = est["limits"]
    cal = "calibrated" if hw.calibrated else "UNCALIBRATED datasheet peaks"
    print(f"profile {hw.name} ({cal}); weights {est['model_weight_gb']:.2f} GiB {dtype}, "
          f"KV {est['kv_bytes_per_token'] / 1024:.1f} KiB/token")
    sp = est["split"]
    if sp["devices"] > 1:
        print(f"split tp={sp['tp']} pp={sp['pp']} dp={sp['dp']} ({sp['devices']} devices): "
              f"{sp['weights_per_device_gb']:.2f} GiB of weights per device")
    print(f"prefill of {a.input_len} tokens: {est['prefill_time'] * 1e3:.1f} ms; decode step: "
          f"{est['decode_step_time_batch1'] * 1e3:.2f} ms at batch 1, {est['decode_step_time'] * 1e3:.2f} ms at "
          f"batch {min(a.concurrency, a.max_num_seqs)}")
    print(f"at concurrency {a.concurrency}: TTFT median {c['ttft_median'] * 1e3:.1f} ms (p95 {c['ttft_p95'] * 1e3:.1f}), "
          f"ITL median {c['itl_median'] * 1e3:.2f} ms (p95 {c['itl_p95'] * 1e3:.2f}), output "
          f"{c['output_throughput']:.1f} tok/s, {c['request_throughput']:.2f} req/s")
    print(f"limits: KV memory holds {lim['kv_memory_concurrency']} such requests; decode turns compute bound "
          f"at batch ~{lim['compute_bound_batch']:.0f}; max_num_seqs {lim['max_num_seqs']}; batch-1 decode "
          f"{lim['bandwidth_decode_tok_s_batch1']:.1f} tok/s (bandwidth bound)")
    return 0


def _print_search(a, m, hw, knobs, constraints) -> int:
    from . import split_search

    res = split_search.search(m, hw, a.num_gpus, a.concurrency, a.input_len, a.output_len, knobs, constraints,
                              a.kv_cache_memory_gb)
    res["profile"] = {"name": hw.name, "calibrated": hw.calibrated, "notes": hw.notes}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        cal = "calibrated" if hw.calibrated else "UNCALIBRATED datasheet peaks"
        print(f"profile {hw.name} ({cal}); concurrency {a.concurrency}, {a.input_len} in / {a.output_len} out")
        print(split_search.render(res))
    return 0
