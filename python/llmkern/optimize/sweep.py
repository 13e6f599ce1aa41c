"""`llmkern optimize`: run every configuration of a sweep on a workload, store each measurement and
its estimate in the runs database, print the picks and Pareto fronts.

Each result is written in one transaction after its configuration finishes, so Ctrl-C (or a kill)
loses at most the configuration in progress; `--continue` resumes the newest sweep with the same
model, workload and sweep spec, skipping configurations that already have a result."""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import tempfile
import time
from typing import List, Optional

from .. import machine_load
from . import db as dbm
from . import frameworks
from . import knobs as knobs_mod
from . import engine_calibration, profiles, report, workloads
from .estimate import EngineKnobs, ModelShape, SimRequest, kv_cache_tokens, model_config, simulate
from .grammar import parse_constraints, parse_sweep
from .measure import SERVED_NAME, log, measure_offline, measure_serve

MACHINE_NOTE_ENV = "LLMKERN_MACHINE_NOTES"   # free text stored with the machine (e.g. "shared with other jobs")


def _prompt_ids(tok, wl: workloads.Workload) -> List[List[int]]:
    if tok is None:
        raise ValueError("--model: has no tokenizer; optimize needs one to size the prompts")
    return [tok.encode_chat([{"role": "user", "content": r.prompt}]) for r in wl.requests]


def _sim_requests(wl: workloads.Workload, prompt_tokens: List[int], prefix_tokens: int) -> List[SimRequest]:
    key = "shared" if wl.prefix_words else None
    return [SimRequest(r.arrival, p, r.max_tokens, key, prefix_tokens if key else 0)
            for r, p in zip(wl.requests, prompt_tokens)]


def _prefix_tokens(tok, wl: workloads.Workload) -> int:
    """Tokens the shared-prefix workload's prompts have in common (the cacheable part)."""
    if not wl.prefix_words:
        return 0
    a = tok.encode_chat([{"role": "user", "content": wl.requests[0].prompt}])
    b = tok.encode_chat([{"role": "user", "content": wl.requests[1].prompt}]) if len(wl.requests) > 1 else a
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def machine_row(db: dbm.RunsDB, hw: profiles.HardwareProfile, notes: str) -> int:
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no GPU description is not an error
        pass
    limits = {"bandwidth_gbs": hw.bandwidth / 1e9, "gemm_gflops": {k: v / 1e9 for k, v in hw.gemm_flops.items()},
              "attn_decode_gbs": hw.attn_decode_bw / 1e9, "attn_prefill_gflops": hw.attn_prefill_flops / 1e9,
              "step_overhead_ms": hw.step_overhead_s * 1e3, "seq_overhead_ms": hw.seq_overhead_s * 1e3,
              "calibrated": hw.calibrated, "profile": hw.name}
    return db.add_machine(profiles.cpu_model(), os.cpu_count() or 0, gpu, profiles.memory_gb(), limits, notes)


def run(a) -> int:
    from .. import __version__
    from ..models.loader import DEFAULT_MODEL_NAME, load_tokenizer

    constraints = parse_constraints(a.constraints)
    fw = getattr(a, "framework", None) or "llmkern"
    configs = [knobs_mod.canonical(c, fw) for c in parse_sweep(a.sweep)] if a.sweep else [{}]
    wl = workloads.load(a.workload, a.num_requests, a.request_rate, a.seed, offline=a.offline)
    if wl.kind == "offline" and any(knobs_mod.split(c)[1] for c in configs):
        raise ValueError("--sweep: request_rate / max_concurrency do not apply to an offline workload")
    if wl.kind == "offline" and fw != "llmkern":   # another server gets the whole batch through its API at once
        wl = dataclasses.replace(wl, spec=dict(wl.spec, client="server, every request at once"))
    for c in configs:   # knobs are checked before anything runs
        frameworks.check(fw, knobs_mod.split(c)[0])
        if wl.kind == "offline" and fw == "llmkern":
            knobs_mod.engine_kwargs(knobs_mod.split(c)[0])
    cfg = model_config(a.model)
    dtype = a.dtype or "float32"
    shape = ModelShape.from_config(cfg, dtype).with_stored_weights(a.model)
    tok = load_tokenizer(a.model)
    prompt_ids = _prompt_ids(tok, wl)
    prompt_tokens = [len(p) for p in prompt_ids]
    prefix_tokens = _prefix_tokens(tok, wl)
    model_name = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))

    hw = profiles.load(a.profile) if a.profile else None
    if hw is None:
        par = fw == "llmkern" and any(int(c.get(f"{n}_parallel_size") or 1) > 1
                                      for c in configs for n in ("tensor", "pipeline"))
        log("calibrating this machine (bandwidth, GEMM, attention, runtime overheads"
            + (", tensor/pipeline parallel costs" if par else "") + ") ...")
        hw = profiles.calibrate(parallel=par)
    notes = a.machine_notes or os.environ.get(MACHINE_NOTE_ENV, "")
    with dbm.open_db(a.db) as db:
        machine_id = machine_row(db, hw, notes)
        wl_id = db.add_workload(wl.name, wl.kind, dict(wl.spec, prompt_tokens=sum(prompt_tokens),
                                                       output_tokens=sum(r.max_tokens for r in wl.requests)),
                                len(wl.requests))
        sweep = db.latest_sweep(model_name, wl_id, a.sweep or "", fw) if a.resume else None
        if sweep is not None:
            sweep_id = sweep["id"]
            done = db.finished_config_keys(sweep_id)
            db.resume_sweep(sweep_id)
            log(f"continuing sweep {sweep_id}: {len(done)} of {len(configs)} configurations already done")
        else:
            if a.resume:
                log("--continue: no earlier sweep with this model, workload and sweep; starting a new one")
            sweep_id = db.start_sweep(model_name, machine_id, wl_id, __version__, a.sweep or "", a.constraints or "",
                                      list(getattr(a, "argv", []) or []),
                                      {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
                                       "vocab_size": cfg.vocab_size, "dtype": dtype}, notes, fw,
                                      frameworks.version(fw, a.vllm_exe, a.sglang_python))
            done = set()
        todo = [c for c in configs if dbm.canonical_key(c) not in done]
        status = "interrupted"
        tmp = tempfile.mkdtemp(prefix="llmkern-optimize-")
        try:
            model_dir = a.model
            if fw != "llmkern" and model_dir is None:   # the peers load a HF directory
                from ..bench.serving import hf_model_dir

                model_dir = hf_model_dir(tmp)
            _run_configs(a, db, sweep_id, todo, wl, prompt_ids, prompt_tokens, prefix_tokens, shape, hw,
                         constraints, fw, model_dir)
            status = "done"
        finally:
            db.finish_sweep(sweep_id, status)
            shutil.rmtree(tmp, ignore_errors=True)
        points = [p for p in db.iter_results(sweep_id=sweep_id)]
    print(report.render(points, constraints))
    return 0


def _peer_server(a, fw: str, model_dir: str, server_knobs: dict) -> frameworks.Server:
    srv = frameworks.server(fw, model_dir, server_knobs, a.dtype or "float32", SERVED_NAME, a.max_model_len,
                            a.vllm_exe, a.sglang_python)
    if a.kv_cache_memory_gb and fw == "vllm":   # vLLM's CPU backend sizes its KV cache from this (GiB)
        srv.env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(a.kv_cache_memory_gb)))
    return srv


def _run_configs(a, db, sweep_id, todo, wl, prompt_ids, prompt_tokens, prefix_tokens, shape, hw, constraints,
                 fw: str = "llmkern", model_dir: Optional[str] = None):
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="optimize", unit="config", dynamic_ncols=True, disable=a.quiet)
    # One short probe on a shared machine is noisy: each estimate uses the median of the sweep's
    # calibration and every probe so far, which follows lasting load changes but not one bad probe.
    probes = [hw]
    fits: dict = {}   # quantisation mode -> the estimate's calibration on the swept model (one each)
    for c in todo:
        server_knobs, client_knobs = knobs_mod.split(c)
        cwl = wl.with_rate(client_knobs.get("request_rate"))
        extra = (["--kv-cache-memory-gb", str(a.kv_cache_memory_gb)] if a.kv_cache_memory_gb else []) + \
                (["--dtype", a.dtype] if a.dtype else [])
        shape_c = shape.dense() if c.get("quantization") == "none" else shape
        run_knobs = _engine_knobs(c, wl, extra)
        ek = EngineKnobs.from_knobs(run_knobs, kv_cache_tokens(shape, a.kv_cache_memory_gb or 2.0))
        if fw == "llmkern" and hw.calibrated and hw.device == "cpu" and not a.no_engine_calibration:
            # The fit was measured on the engine against this profile: it stands for the engine's
            # speed as a whole, and re-scaling it with later probes of the machine (a synthetic read
            # and GEMM, noisier than the drift they follow) made the estimates worse, not better.
            hw_now = engine_calibration.apply(hw, _engine_fit(a, fits, c, wl, hw, shape_c, extra))
        else:
            if a.recalibrate and hw.calibrated:
                probes.append(profiles.remeasure(hw))
            hw_now = profiles.median_of(probes) if len(probes) > 1 else hw
        sim, other = None, {}
        if fw == "llmkern":   # the estimate models llmkern's engine
            sim_reqs = _sim_requests(cwl, prompt_tokens, prefix_tokens)
            sim = simulate(sim_reqs, shape_c, hw_now, ek)
            sim.pop("requests")
            sim["profile_bandwidth_gbs"] = hw_now.bandwidth / 1e9       # the rates this estimate used
            sim["profile_gemm_gflops"] = shape_c.gemm_rate(hw_now, bool(shape_c.quant_linear_bytes)) / 1e9
            sim["profile_attn_decode_gbs"] = hw_now.attn_decode_bw / 1e9
            sim["profile_step_overhead_ms"] = hw_now.step_overhead_s * 1e3
            sim["profile_seq_overhead_ms"] = hw_now.seq_overhead_s * 1e3
            for k, v in (hw_now.extra or {}).items():   # the engine calibration's fit and measurements
                sim[f"profile_{k}"] = v
            other = _profile_estimates(a, sim_reqs, shape_c, c, run_knobs)
        cmd = knobs_mod.serve_command(a.model, server_knobs, extra)
        bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in c.items())[:60])
        for attempt in range(1 + max(0, a.retry_busy)):
            started = time.time()
            metrics, rows, load, status, err, peer_cmd = _measure(a, fw, wl, cwl, model_dir, server_knobs,
                                                                  client_knobs, prompt_ids, prompt_tokens,
                                                                  constraints, extra)
            busy = machine_load.is_busy(load)
            if busy:
                log(f"configuration {c}: other work used {100 * load['foreign_cpu']:.0f}% of the machine during "
                    f"the run" + ("; measuring it again" if attempt < a.retry_busy else "; recorded as taken on "
                                  "a busy machine"))
            if not busy or status != "ok":
                break
        cmd = peer_cmd or cmd
        db.record_result(sweep_id, c, status, metrics, sim, rows, cmd, err, started, load, other)
        bar.update(1)
    bar.close()


def _engine_fit(a, fits: dict, knobs: dict, wl: workloads.Workload, hw: profiles.HardwareProfile,
                shape: ModelShape, extra: List[str]) -> "engine_calibration.Fit":
    """The estimate's calibration on the swept model, made once per quantisation mode the sweep
    runs (the first configuration of each mode measures it, before its own run)."""
    quant = knobs.get("quantization") or "auto"
    mode = "none" if quant == "none" else "quantised"
    if mode not in fits:
        served = wl.kind != "offline"
        log(f"calibrating the estimate on this model (quantization {quant}, "
            + ("through `llmkern serve`" if served else "in-process") + ") ...")
        eng = {k: v for k, v in {"kv_cache_memory_gb": a.kv_cache_memory_gb, "dtype": a.dtype}.items() if v}
        eng["quantization"] = None if quant == "none" else quant
        args = list(extra) + ["--quantization", quant] if served else None
        fits[mode] = engine_calibration.calibrate_for_model(hw, shape, a.model, eng, args, a.timeout)
    return fits[mode]


def _engine_knobs(knobs: dict, wl: workloads.Workload, extra: List[str]) -> dict:
    """The configuration's knobs with the scheduler settings its engine really runs with: a serving
    workload's are `llmkern serve`'s (on a CPU a 512-token step budget and one step of decode
    deferral unless set), an offline one's are LLM's."""
    if wl.kind == "offline":
        return knobs
    from ..serve.command_args import serve_engine_kwargs, serve_parser

    server_knobs, _ = knobs_mod.split(knobs)
    kw = serve_engine_kwargs(serve_parser().parse_args(list(extra) + knobs_mod.serve_flags(server_knobs)))
    out = dict(knobs)
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "decode_defer_steps", "short_prompt_share"):
        if kw.get(name) is not None:
            out.setdefault(name, kw[name])
    return out


def _measure(a, fw, wl, cwl, model_dir, server_knobs, client_knobs, prompt_ids, prompt_tokens, constraints, extra):
    """One measurement: (metrics, rows, load, status, error, the peer's command line or None)."""
    peer_cmd = None
    try:
        if wl.kind == "offline" and fw == "llmkern":
            eng = {"kv_cache_memory_gb": a.kv_cache_memory_gb, "dtype": a.dtype}
            metrics, rows, load = measure_offline(a.model, server_knobs, prompt_ids, [r.max_tokens for r in wl.requests],
                                                  constraints, extra_engine={k: v for k, v in eng.items() if v})
        else:
            srv = None
            if fw != "llmkern":
                srv = _peer_server(a, fw, model_dir, server_knobs)
                peer_cmd = shlex.join(srv.argv)
            metrics, rows, load = measure_serve(a.model, server_knobs, client_knobs, cwl.requests, prompt_tokens,
                                                constraints, a.timeout, extra, server=srv)
        return metrics, rows, load, ("ok" if metrics["completed"] else "failed"), None, peer_cmd
    except (RuntimeError, ValueError, OSError) as e:
        err = f"{type(e).__name__}: {e}"[-2000:]
        log(f"configuration {dict(server_knobs, **client_knobs)} failed: {err[:300]}")
        return {}, [], {}, "failed", err, peer_cmd


def _profile_estimates(a, sim_reqs, shape: ModelShape, knobs: dict, engine_knobs: dict) -> dict:
    """The same requests estimated on each --estimate-profile (e.g. a GPU from its datasheet), in
    the dtype that hardware runs (bf16 on a GPU), with the configuration's scheduler knobs (on a GPU
    without the CPU server's smaller step budget)."""
    out = {}
    for name in a.estimate_profiles or ():
        hwp = profiles.load(name)
        sh = shape if hwp.device == "cpu" else dataclasses.replace(shape, dtype="bfloat16")
        kn = engine_knobs if hwp.device == "cpu" else {k: v for k, v in engine_knobs.items()
                                                       if k != "max_num_batched_tokens" or k in knobs}
        ek = EngineKnobs.from_knobs(kn, kv_cache_tokens(sh, a.kv_cache_memory_gb or 2.0))
        est = simulate(sim_reqs, sh, hwp, ek)
        est.pop("requests")
        out[hwp.name] = est
    return out


def report_only(path: Optional[str]) -> int:
    """Print the report of every sweep in an existing database (nothing is run or written)."""
    path = path or dbm.user_db_path()
    with dbm.open_db(path, readonly=True) as db:
        workloads_by_id = {w["id"]: w for w in db.workloads()}
        for s in db.sweeps():
            points = list(db.iter_results(sweep_id=s["id"]))
            wl = workloads_by_id.get(s["workload_id"], {}).get("name")
            print(f"## sweep {s['id']}: {s['model']} on {wl}, sweep {s['sweep_spec']!r}, "
                  f"constraints {s['constraints']!r}, {s['status']}\n")
            print(report.render(points, parse_constraints(s["constraints"])) + "\n")
    return 0
