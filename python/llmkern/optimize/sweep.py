"""`llmkern optimize`: run every configuration of a sweep on a workload, store each measurement and
its estimate in the runs database, print the picks and Pareto fronts.

Each result is written in one transaction after its configuration finishes, so Ctrl-C (or a kill)
loses at most the configuration in progress; `--continue` resumes the newest sweep with the same
model, workload and sweep spec, skipping configurations that already have a result."""
from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from typing import List, Optional

from . import db as dbm
from . import frameworks
from . import knobs as knobs_mod
from . import profiles, report, workloads
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
    if wl.kind == "offline" and fw != "llmkern":
        raise ValueError(f"--framework {fw}: an offline workload runs llmkern in-process; sweep a serving workload")
    for c in configs:   # knobs are checked before anything runs
        frameworks.check(fw, knobs_mod.split(c)[0])
        if wl.kind == "offline":
            knobs_mod.engine_kwargs(knobs_mod.split(c)[0])
    cfg = model_config(a.model)
    dtype = a.dtype or "float32"
    shape = ModelShape.from_config(cfg, dtype)
    tok = load_tokenizer(a.model)
    prompt_ids = _prompt_ids(tok, wl)
    prompt_tokens = [len(p) for p in prompt_ids]
    prefix_tokens = _prefix_tokens(tok, wl)
    model_name = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))

    hw = profiles.load(a.profile) if a.profile else None
    if hw is None:
        log("calibrating this machine (bandwidth, GEMM, attention, runtime overheads) ...")
        hw = profiles.calibrate()
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
    for c in todo:
        server_knobs, client_knobs = knobs_mod.split(c)
        cwl = wl.with_rate(client_knobs.get("request_rate"))
        ek = EngineKnobs.from_knobs(c, kv_cache_tokens(shape, a.kv_cache_memory_gb or 2.0))
        if a.recalibrate and hw.calibrated:
            probes.append(profiles.remeasure(hw))
            hw_now = profiles.median_of(probes)
        else:
            hw_now = hw
        sim, srv = None, None
        if fw == "llmkern":   # the estimate models llmkern's engine
            sim = simulate(_sim_requests(cwl, prompt_tokens, prefix_tokens), shape, hw_now, ek)
            sim.pop("requests")
            sim["profile_bandwidth_gbs"] = hw_now.bandwidth / 1e9       # the rates this estimate used
            sim["profile_gemm_gflops"] = hw_now.gemm(shape.dtype) / 1e9
            sim["profile_attn_decode_gbs"] = hw_now.attn_decode_bw / 1e9
        extra = (["--kv-cache-memory-gb", str(a.kv_cache_memory_gb)] if a.kv_cache_memory_gb else []) + \
                (["--dtype", a.dtype] if a.dtype else [])
        cmd = knobs_mod.serve_command(a.model, server_knobs, extra)
        started = time.time()
        bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in c.items())[:60])
        try:
            if wl.kind == "offline":
                eng = {"kv_cache_memory_gb": a.kv_cache_memory_gb, "dtype": a.dtype}
                metrics, rows = measure_offline(a.model, server_knobs, prompt_ids, [r.max_tokens for r in wl.requests],
                                                constraints, extra_engine={k: v for k, v in eng.items() if v})
            else:
                if fw != "llmkern":
                    srv = _peer_server(a, fw, model_dir, server_knobs)
                    cmd = shlex.join(srv.argv)
                metrics, rows = measure_serve(a.model, server_knobs, client_knobs, cwl.requests, prompt_tokens,
                                              constraints, a.timeout, extra, server=srv)
            status, err = ("ok" if metrics["completed"] else "failed"), None
        except (RuntimeError, ValueError, OSError) as e:
            metrics, rows, status, err = {}, [], "failed", f"{type(e).__name__}: {e}"[-2000:]
            log(f"configuration {c} failed: {err[:300]}")
        db.record_result(sweep_id, c, status, metrics, sim, rows, cmd, err, started)
        bar.update(1)
    bar.close()


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
