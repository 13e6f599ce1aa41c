"""Hardware profiles for the estimate: measured (calibrated) on this machine, or datasheet peaks.

A profile holds the rates the step-time model needs: memory read bandwidth, dense GEMM FLOP/s per
dtype, paged-decode attention K/V read rate and prefill attention FLOP/s (llmkern's own kernels),
the runtime's fixed cost per engine step and per sequence in a step, and the link between two
ranks (CPU: gloo all-reduces between two processes, optimize/collectives.py). `calibrate()` measures
them with the benchmark suite's helpers (llmkern.bench.common) in a few seconds; the datasheet
profiles are peaks, never reached, and say so (calibrated=False)."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional

from .._build import cpu_model


@dataclass
class HardwareProfile:
    name: str
    device: str                           # 'cpu' | 'cuda'
    calibrated: bool
    bandwidth: float                      # memory read bytes/s
    gemm_flops: Dict[str, float]          # dtype name -> dense matmul FLOP/s
    attn_decode_bw: float                 # paged decode attention: K/V bytes read per second
    attn_prefill_flops: float             # causal prefill attention FLOP/s (QK^T + PV)
    memory_gb: float                      # device memory (KV capacity is the engine's setting)
    step_overhead_s: float = 0.0          # per engine step: scheduling, tensor building, launch
    seq_overhead_s: float = 0.0           # per sequence in a step: sampling, detokenising, bookkeeping
    link_bw: float = 0.0                  # between two devices, bytes/s each way (0: bandwidth / 4)
    link_latency_s: float = 1e-4          # per collective step (ring hop) or send
    stage_latency_s: float = 0.0          # per pipeline hand-over as the engine pays it (0: link_latency_s)
    cores: Optional[int] = None
    notes: str = ""
    measured_at: Optional[float] = None
    extra: Dict[str, float] = field(default_factory=dict)

    def gemm(self, dtype: str) -> float:
        return self.gemm_flops.get(dtype) or self.gemm_flops.get("float32") or max(self.gemm_flops.values())

    @property
    def link(self) -> "tuple[float, float]":
        """(bytes/s each way, latency per step) between two devices (ranks)."""
        return self.link_bw or self.bandwidth / 4, self.link_latency_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HardwareProfile":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


_T = 1e12
# Datasheet peaks (dense, no sparsity). Step overheads are a guess for a CUDA-graph decode step.
DATASHEETS = {
    "H100": HardwareProfile("H100", "cuda", False, 3.35e12, {"bfloat16": 989 * _T, "float16": 989 * _T,
                                                             "float32": 67 * _T}, 3.35e12, 989 * _T * 0.5, 80.0,
                            step_overhead_s=2e-4, link_bw=450e9, link_latency_s=1e-5,
                            notes="H100 SXM 80GB datasheet peaks (NVLink 900 GB/s both ways), uncalibrated"),
    "H200": HardwareProfile("H200", "cuda", False, 4.8e12, {"bfloat16": 989 * _T, "float16": 989 * _T,
                                                            "float32": 67 * _T}, 4.8e12, 989 * _T * 0.5, 141.0,
                            step_overhead_s=2e-4, link_bw=450e9, link_latency_s=1e-5,
                            notes="H200 SXM 141GB datasheet peaks (NVLink 900 GB/s both ways), uncalibrated"),
    "A100": HardwareProfile("A100", "cuda", False, 2.039e12, {"bfloat16": 312 * _T, "float16": 312 * _T,
                                                              "float32": 19.5 * _T}, 2.039e12, 312 * _T * 0.5, 80.0,
                            step_overhead_s=2e-4, link_bw=300e9, link_latency_s=1e-5,
                            notes="A100 SXM 80GB datasheet peaks (NVLink 600 GB/s both ways), uncalibrated"),
    "A100-40GB": HardwareProfile("A100-40GB", "cuda", False, 1.555e12, {"bfloat16": 312 * _T, "float16": 312 * _T,
                                                                        "float32": 19.5 * _T}, 1.555e12,
                                 312 * _T * 0.5, 40.0, step_overhead_s=2e-4, link_bw=300e9, link_latency_s=1e-5,
                                 notes="A100 SXM 40GB datasheet peaks (NVLink 600 GB/s both ways), uncalibrated"),
    "L40S": HardwareProfile("L40S", "cuda", False, 864e9, {"bfloat16": 362 * _T, "float16": 362 * _T,
                                                           "float32": 91.6 * _T}, 864e9, 362 * _T * 0.5, 48.0,
                            step_overhead_s=2e-4, link_bw=32e9, link_latency_s=2e-5,
                            notes="L40S 48GB datasheet peaks (no NVLink: PCIe 4.0 x16, 64 GB/s both ways), "
                                  "uncalibrated"),
}


def profile_dir() -> str:
    """Where calibrated profiles are saved: $LLMKERN_PROFILE_DIR, else ~/.cache/llmkern/profiles."""
    return os.environ.get("LLMKERN_PROFILE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "llmkern",
                                                                  "profiles")


def save(p: HardwareProfile, path: Optional[str] = None) -> str:
    path = path or os.path.join(profile_dir(), p.name + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(p.to_dict(), f, indent=1)
    os.replace(tmp, path)
    return path


def load(name: str, option: str = "--profile") -> HardwareProfile:
    """A datasheet name (H100, H200, A100, A100-40GB, L40S), a saved profile's name, or a JSON file
    path. ValueError naming `option` (the command-line option that gave the name) otherwise."""
    if name in DATASHEETS:
        return DATASHEETS[name]
    path = name if name.endswith(".json") else os.path.join(profile_dir(), name + ".json")
    if not os.path.isfile(path):
        raise ValueError(f"{option}: no profile {name!r} (expected one of {', '.join(DATASHEETS)}, a profile "
                         f"saved by `llmkern estimate --calibrate`, or a .json file)")
    try:
        with open(path) as f:
            return HardwareProfile.from_dict(json.load(f))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{option}: {path!r} is not a profile ({e})") from None


def memory_gb() -> Optional[float]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _attention_rates(device: str, min_time: float):
    """llmkern's paged decode attention (K/V bytes/s) and causal prefill attention (FLOP/s) on a
    SmolLM2-like head shape."""
    import torch

    import llmkern
    from ..bench.common import timeit

    hq, hkv, d, bs, nseq, ctx = 9, 3, 64, 16, 16, 1024
    nblk = ctx // bs
    kc = torch.randn(nseq * nblk, bs, hkv, d, device=device)
    vc = torch.randn_like(kc)
    bt = torch.arange(nseq * nblk, dtype=torch.int32, device=device).view(nseq, nblk)
    lens = torch.full((nseq,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(nseq, 1, hq, d, device=device)
    t = timeit(lambda: llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, causal=True),
               device, min_time=min_time)
    decode_bw = 2 * kc.numel() * kc.element_size() / t
    s = 512
    qp = torch.randn(s, hq, d, device=device)
    kp = torch.randn(s, hkv, d, device=device)
    vp = torch.randn_like(kp)
    cu = torch.tensor([0, s], dtype=torch.int32, device=device)
    t = timeit(lambda: llmkern.flash_attn_varlen_func(qp, kp, vp, cu, cu, s, s, causal=True), device,
               min_time=min_time)
    prefill_flops = 4 * hq * d * s * (s + 1) / 2 / t
    return decode_bw, prefill_flops


def _quant_gemm_flops(device: str, min_time: float, n: int = 1024, rows: int = 256) -> float:
    """llmkern's weight-quantised GEMM (Q4_1, the embedded model's format; int8 activations on a
    CPU) at a prefill chunk's rows: the rate a GGUF's projections run at when compute bound."""
    import gguf
    import numpy as np
    import torch

    import llmkern
    from ..bench.common import timeit

    w = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    wq, layout = llmkern.ops.pack_quant_weight(raw, "Q4_1", n, n, device=device)
    x = torch.randn(rows, n, device=device)
    t = timeit(lambda: llmkern.ops.linear_quant(x, wq, n, layout), device, min_time=min_time)
    return 2 * rows * n * n / t


def _tiny_engine(device: str, layers: int = 1, kv_heads: int = 2, **parallel):
    """An engine over a tiny random model (hidden 64) whose arithmetic is negligible: what it
    measures is the runtime's own cost."""
    from ..engine import LLM

    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": kv_heads,
           "max_position_embeddings": 512, "tie_word_embeddings": True}
    return LLM(cfg, load_format="dummy", device=device, max_num_seqs=64, kv_cache_memory_gb=0.05, **parallel)


def _tiny_decode_step(llm, nseq: int, n_out: int = 32) -> float:
    """Median decode step of a tiny engine at nseq sequences (s)."""
    from statistics import median

    from ..engine import SamplingParams

    sp = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True)
    prompts = [[1 + (i % 500)] * 4 for i in range(nseq)]
    llm.generate(prompts, [sp] * nseq, use_tqdm=False)      # warm-up
    out = llm.generate(prompts, [sp] * nseq, use_tqdm=False)
    return median(x for o in out for x in o.metrics.inter_token_latencies[2:])


def _engine_parallel_costs(device: str, layers: int = 10) -> "tuple[float, float]":
    """(per ring step of an all-reduce, per pipeline hand-over) as llmkern's engine pays them on
    this machine: decode steps of a tiny model (arithmetic negligible) at tp=2 and at pp=2 against
    one rank. Two ranks' all-reduce is 2 ring steps, two per layer; a pp=2 round is 2 stage slots.
    Under the engine's load these cost several times an idle gloo ping (measure_link)."""
    steps = {}
    for name, kw in (("one", {}), ("tp", {"tensor_parallel_size": 2}), ("pp", {"pipeline_parallel_size": 2})):
        llm = _tiny_engine(device, layers, **kw)
        try:
            steps[name] = _tiny_decode_step(llm, 1)
        finally:
            llm.shutdown()
    allreduce = max(0.0, steps["tp"] - steps["one"]) / (2 * layers)
    return allreduce / 2, max(0.0, steps["pp"] - steps["one"]) / 2


def _runtime_overheads(device: str):
    """Fixed cost per engine step and per sequence: decode steps of a tiny random model (1 layer,
    hidden 64), whose arithmetic is negligible, at 1 and 16 sequences."""
    from ..engine import SamplingParams

    llm = _tiny_engine(device, layers=1, kv_heads=1)
    n_out = 48

    def per_step(nseq: int) -> float:
        sp = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True)
        prompts = [[1 + (i % 500)] * 4 for i in range(nseq)]
        llm.generate(prompts, [sp] * nseq, use_tqdm=False)      # warm-up
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            llm.generate(prompts, [sp] * nseq, use_tqdm=False)
            best = min(best, (time.perf_counter() - t0) / n_out)
        return best

    t1, t16 = per_step(1), per_step(16)
    per_seq = max(0.0, (t16 - t1) / 15)
    return max(0.0, t1 - per_seq), per_seq


def _rates(device: str, quick: bool) -> dict:
    """Fresh measurements of the rates a shared machine's load moves (not the suite's cached ones)."""
    import torch

    from ..bench import common

    min_time = 0.2 if quick else 0.5
    common.configure(quick=quick)
    bw = common.read_bandwidth.__wrapped__(device, nbytes=(128 << 20) if quick else (256 << 20))
    gemm = {"float32": common.matmul_flops.__wrapped__(torch.float32, device)}
    if not quick:
        gemm["bfloat16"] = common.matmul_flops.__wrapped__(torch.bfloat16, device)
    if device == "cpu":
        gemm["gguf"] = _quant_gemm_flops(device, min_time)
    dec_bw, pre_flops = _attention_rates(device, min_time)
    return dict(bandwidth=bw, gemm_flops=gemm, attn_decode_bw=dec_bw, attn_prefill_flops=pre_flops)


def remeasure(p: HardwareProfile) -> HardwareProfile:
    """p with its bandwidth, GEMM and attention rates measured again now (a second or two); the
    runtime overheads are kept."""
    from dataclasses import replace

    r = _rates(p.device, quick=True)
    r["gemm_flops"] = dict(p.gemm_flops, **r["gemm_flops"])
    return replace(p, measured_at=time.time(), **r)


def median_of(ps: "list[HardwareProfile]") -> HardwareProfile:
    """The last profile with each measured rate replaced by its median over all of them."""
    from dataclasses import replace
    from statistics import median

    gemm = {k: median(p.gemm_flops[k] for p in ps if k in p.gemm_flops) for k in ps[-1].gemm_flops}
    return replace(ps[-1], bandwidth=median(p.bandwidth for p in ps), gemm_flops=gemm,
                   attn_decode_bw=median(p.attn_decode_bw for p in ps),
                   attn_prefill_flops=median(p.attn_prefill_flops for p in ps))


def calibrate(name: str = "cpu", device: str = "cpu", quick: bool = True, notes: str = "",
              parallel: Optional[bool] = None) -> HardwareProfile:
    """Measure this machine's rates (a few seconds with quick, plus ~10 s for the link between two
    CPU ranks, plus ~30 s with parallel for what tp/pp cost in the engine: the default without
    quick) and return a calibrated profile."""
    import torch

    rates = _rates(device, quick)
    step_oh, seq_oh = _runtime_overheads(device)
    link: Dict[str, float] = {}
    if device == "cpu":
        from .collectives import measure_link

        try:
            link["link_bw"], link["link_latency_s"] = measure_link()
        except RuntimeError:
            pass   # the default: a quarter of the memory bandwidth (HardwareProfile.link)
        if parallel if parallel is not None else not quick:
            link["link_latency_s"], link["stage_latency_s"] = _engine_parallel_costs(device)
    return HardwareProfile(name=name, device=device, calibrated=True, **rates, memory_gb=memory_gb() or 0.0,
                           step_overhead_s=step_oh, seq_overhead_s=seq_oh, cores=os.cpu_count(), **link,
                           notes=notes or f"{cpu_model()}, {os.cpu_count()} cores, torch threads "
                                          f"{torch.get_num_threads()}", measured_at=time.time())
