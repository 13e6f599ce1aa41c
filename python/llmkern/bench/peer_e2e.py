"""llmkern vs the peers that run in their own venvs (vLLM's CPU build, CTranslate2, llama.cpp;
see peers/__init__.py), on offline-32 and batch-1 decode (throughput.py's workloads), fp32 and
bf16 on the weights dequantised, and "gguf": the GGUF as stored
(llama.cpp on the same file, llmkern's quantised kernels).

Each pair is measured alternately (llmkern, peer, llmkern, peer, ...; medians reported) so load
that comes and goes on a shared machine hits both sides alike; the load average is recorded with
every row. Both engines' prefix caches are emptied (untimed) before each run, so every run
computes its prompts as a one-shot job would (else the repeats would read the first run's cache,
and the engine with the better cache would win on that alone). Beside the speed: token agreement
of the greedy outputs (peers/agreement.py), since a faster engine that computes something else is
no win. A peer that is not configured or fails is skipped with its reason, which the report
carries."""
from __future__ import annotations

import statistics
import sys
import time
from typing import Dict, List, Optional

from ..machine_load import LoadMeter, settle
from .common import Record
from .peers import PEERS, PeerSpec
from .peers.agreement import token_agreement
from .peers.client import PeerError, PeerProcess, find_python
from .throughput import decode_workload, offline_workload

_DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "gguf": "gguf"}


def _log(msg: str) -> None:
    print(f"[e2e/peers] {msg}", file=sys.stderr, flush=True)


class _Llmkern:
    """One llmkern engine per dtype, built on first use and kept for every peer."""

    def __init__(self, device: str):
        self.device, self.llms = device, {}

    def run(self, dtype: str, prompts, outs, fresh: bool = False) -> tuple:
        from ..engine.llm import LLM
        from ..engine.sampling_params import SamplingParams

        if dtype not in self.llms:  # fp32 / bf16: the peers' dense weights; gguf: the file's own
            kw = {"quantization": "gguf"} if dtype == "gguf" else {"dtype": dtype, "quantization": None}
            # kv_prefault: the KV pool's pages are faulted in at start-up, as vLLM zero-fills its
            # cache then; lazily, each run would pay for the pages the previous ones had not touched.
            self.llms[dtype] = LLM(device=self.device, kv_cache_memory_gb=1.0, kv_prefault=True, **kw)
            self.run(dtype, prompts[:2], [4] * min(2, len(prompts)))  # warm-up
        sps = [SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in outs]
        if fresh:
            self.llms[dtype].reset_prefix_cache()
        t0 = time.perf_counter()
        res = self.llms[dtype].generate(prompts, sps, use_tqdm=False)
        dt = time.perf_counter() - t0
        return dt, [list(r.outputs[0].token_ids) for r in res]


def _workloads(quick: bool, num_requests: Optional[int]):
    n = num_requests or (4 if quick else 32)
    prompts, outs = offline_workload(n, quick)
    prompt, n_new = decode_workload(quick)
    return {"offline": (f"offline-{n}", "out tok/s", prompts, outs, {"requests": n, "panel": "e2e/offline"}),
            "decode": ("decode-b1", "tok/s", [prompt], [n_new], {})}


def _compare(spec: PeerSpec, peer: PeerProcess, info: dict, dtype: str, ours: _Llmkern, work, reps: int,
             outputs: dict, settle_load: Optional[float] = None) -> Record:
    """One row: reps alternating pairs. outputs: {(engine, dtype, workload): greedy ids} of the
    rows so far, which bf16 rows read to say how far each engine's bf16 moves from its own fp32.
    settle_load: the row starts once the 1-minute load average is under it (the previous row's
    two engines leave it near the CPU count for a minute or so)."""
    name, metric, prompts, outs, axes = work
    peer.generate(prompts[:2], [4] * min(2, len(prompts)))  # warm-up (also the llmkern side's, in run())
    ours.run(dtype, prompts[:2], [4] * min(2, len(prompts)))
    settled = settle(settle_load) if settle_load else None
    # the load average, and other work's share of the machine over the row (the peer is a child:
    # its CPU time is ours)
    meter = LoadMeter().start()
    t_ours, t_peer, ids_ours, ids_peer, idle_waits = [], [], None, None, []
    for _ in range(reps):  # every run computes its prompts: no engine reads the last run's prefix cache
        # Each run starts on an idle machine: vLLM's CPU engine polls a core for ~1 s after a
        # batch, which the llmkern run after it would otherwise share (~10% of offline-32 bf16).
        # llmkern's own threads sleep within LLMKERN_SPIN_US (300 us) of its last kernel.
        idle_waits.append(peer.wait_idle())
        dt, ids_ours = ours.run(dtype, prompts, outs, fresh=True)
        t_ours.append(dt)
        dt, ids_peer = peer.generate(prompts, outs, fresh=True)
        t_peer.append(dt)
    machine = meter.stop()
    load0, load1, foreign = machine["load_1m_before"], machine["load_1m_after"], machine["foreign_cpu"]
    agree = token_agreement(ids_ours, ids_peer)
    outputs[(spec.name, dtype, name)] = ids_peer
    outputs[("llmkern", dtype, name)] = ids_ours
    med_ours, med_peer = statistics.median(t_ours), statistics.median(t_peer)
    toks = sum(outs)
    short = _DTYPE_SHORT.get(dtype, dtype)
    _log(f"{name} {short}: llmkern {toks / med_ours:.1f} {metric}, {spec.name} {toks / med_peer:.1f} "
         f"(x{med_peer / med_ours:.2f}), agreement prefix {agree['prefix']:.3f}, load {load0:.1f}-{load1:.1f}, "
         f"other work {'?' if foreign is None else f'{foreign:.0%}'} of the machine")
    extra = {"dtype": short, "peer_version": info.get("version"), "peer_config": info.get("config"),
             "agreement_prefix": agree["prefix"], "agreement_positionwise": agree["positionwise"],
             "identical_sequences": f"{agree['identical']}/{agree['sequences']}",
             "runs": f"{reps} alternating pairs, medians, prefix caches emptied before each, each llmkern run once the peer idles",
             "llmkern_s_runs": " ".join(f"{t:.2f}" for t in t_ours),
             "peer_s_runs": " ".join(f"{t:.2f}" for t in t_peer),
             "peer_idle_wait_s": " ".join(f"{t:.1f}" for t in idle_waits),
             "loadavg_1m": f"{load0:.2f} -> {load1:.2f}", "foreign_cpu": foreign,
             "settle_wait_s": None if settled is None else round(settled, 1)}
    if dtype != "float32":  # how far each engine's own rounding moves its greedy tokens: the scale
        ref = outputs.get(("llmkern", "float32", name))  # against which to read the agreement above
        if ref is None:
            ref = outputs[("llmkern", "float32", name)] = ours.run("float32", prompts, outs)[1]
        extra["agreement_prefix_llmkern_vs_own_fp32"] = token_agreement(ref, ids_ours)["prefix"]
        if (spec.name, "float32", name) in outputs:
            extra[f"agreement_prefix_{spec.name}_vs_own_fp32"] = token_agreement(
                outputs[(spec.name, "float32", name)], ids_peer)["prefix"]
    if axes:
        axes = dict(axes, series=f"llmkern {short} vs {spec.name}")
    return Record(f"e2e/{name}", f"vs {spec.name} {short}", med_ours, spec.name, med_peer, metric,
                  toks / med_ours, extra=extra, axes=axes)


def run_peers(quick: bool = False, device: str = "cpu", num_requests: Optional[int] = None,
              pythons: Optional[Dict[str, str]] = None, options: Optional[Dict[str, dict]] = None,
              reps: Optional[int] = None, dtypes: Optional[List[str]] = None,
              settle_load: Optional[float] = None) -> tuple:
    """(records, {peer: skip reasons}). pythons: {peer name: its python} (else its env var);
    options: {peer name: driver init options} over the defaults; reps: alternating pairs per row
    (default 3, 1 with quick); dtypes: restrict to these; settle_load: each row waits (up to 3
    minutes) for the 1-minute load average to fall under it."""
    from ..cpu_affinity import allowed_cpus
    from .peers.model_dir import hf_model_dir

    pythons, options = pythons or {}, options or {}
    reps = reps or (1 if quick else 3)
    records: List[Record] = []
    skipped: Dict[str, List[str]] = {}
    if device != "cpu":
        return records, {s.name: ["CPU-only peer; --device is " + device] for s in PEERS}
    ours = _Llmkern(device)
    outputs: dict = {}
    works = _workloads(quick, num_requests)
    cpus = allowed_cpus()
    for spec in PEERS:
        python, why = find_python(pythons.get(spec.name), spec.env_var)
        if python is None:
            skipped.setdefault(spec.name, []).append(why)
            _log(f"{spec.name} skipped: {why}")
            continue
        model_dir = hf_model_dir()
        for dtype in spec.dtypes:
            if dtypes and dtype not in dtypes:
                continue
            try:
                opts = dict(spec.options(dtype), **options.get(spec.name, {}))
                with PeerProcess(python, spec.driver, env=spec.env(cpus)) as peer:
                    t0 = time.perf_counter()
                    info = peer.init(model_dir, dtype, len(cpus), **opts)
                    _log(f"{spec.name} {info.get('version')} {dtype} ready in {time.perf_counter() - t0:.0f} s "
                         f"({info.get('config')})")
                    for w in spec.workloads:
                        records.append(_compare(spec, peer, info, dtype, ours, works[w], reps, outputs, settle_load))
            except (PeerError, OSError) as e:
                why = f"{dtype}: {e}"
                skipped.setdefault(spec.name, []).append(why)
                _log(f"{spec.name} skipped: {why}")
    return records, skipped
