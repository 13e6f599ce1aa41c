"""Shared benchmark plumbing: timing, machine limits measured in the same run, records.

Every benchmark reports llmkern next to a named peer measured in the same process, their ratio
(peer time / llmkern time, so > 1 means llmkern is faster) and, where it applies, the fraction of
the machine's limit (memory bandwidth or matmul FLOP/s) measured here, not quoted.

Plot axes. The report draws latency vs sequence length (attention), GB/s vs batch (decode,
sampling) and tok/s vs request count (end-to-end). It takes the x value and the curve of a record
from ``Record.axes`` (an ``Axes``: ``{"seqlen": 2048, "series": "bf16 4 seqs"}``) and never from the
free-text case string; a record without the plot's axis is left out of that plot (with a note).
``extra["peer_value"]`` gives the peer's figure in the record's metric when it is not simply the
same work divided by the peer's time; ``extra["headline"] = True`` picks the case shown in the
report's headline table; ``extra["limit_fraction"]`` gives the fraction of the machine limit when
the limit is not in the metric's unit (end-to-end tok/s against the matmul roofline).
"""
from __future__ import annotations

import inspect
import math
import os
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Optional, TypedDict, Union

import torch

AXIS_KEYS = ("seqlen", "batch", "requests")


class Axes(TypedDict, total=False):
    """Where a record sits on the report's plots; every key is optional.

    seqlen, batch, requests: the x value on the plots that use that axis (tokens, sequences or
    rows, requests). series: the curve the record belongs to within its panel (default: the case
    string); records of one series differ only in the x value. panel: the sub-plot (default: the
    bench name); e.g. "e2e/offline" for the workloads "e2e/offline-32" and "e2e/offline-256".
    """
    seqlen: Union[int, float]
    batch: Union[int, float]
    requests: Union[int, float]
    series: str
    panel: str

# Seconds of timed calls per measurement when a caller does not pass min_time. The suite lowers
# it for --quick runs (configure(quick=True)); a benchmark that passes min_time keeps its own.
_settings = {"min_time": 0.3}
_last_stats: dict = {}


def configure(quick: Optional[bool] = None, min_time: Optional[float] = None) -> None:
    """Set the default timing budget: quick=True -> 0.1 s per measurement, False -> 0.3 s."""
    if quick is not None:
        _settings["min_time"] = 0.1 if quick else 0.3
    if min_time is not None:
        _settings["min_time"] = float(min_time)


def sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _warm(fn, device, warmup: int, min_time: float) -> None:
    """Warm-up calls; after one call slower than min_time, more warm-up buys nothing (the first
    call has paid the one-time costs) and would only lengthen the run."""
    for k in range(warmup):
        t0 = time.perf_counter()
        fn()
        sync(device)
        if time.perf_counter() - t0 > min_time:
            break


def timeit(fn: Callable[[], object], device="cpu", min_time: Optional[float] = None, warmup: int = 2,
           max_iters: int = 1000) -> float:
    """Median seconds per call of fn (after warm-up), timing batches of calls for at least
    min_time seconds in total (default: the configured budget, 0.3 s; 0.1 s in quick runs)."""
    if min_time is None:
        min_time = _settings["min_time"]
    _warm(fn, device, warmup, min_time)
    t0 = time.perf_counter()
    fn()
    sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, min(max_iters, int(0.05 / one)))
    # a call slow enough to be its own batch: the calibration call is already a sample
    samples = [one] if per_batch == 1 else []
    spent = one if per_batch == 1 else 0.0
    while spent < min_time or len(samples) < 3:
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        sync(device)
        dt = time.perf_counter() - t0
        samples.append(dt / per_batch)
        spent += dt
        if len(samples) >= 50:
            break
    samples.sort()
    med = samples[len(samples) // 2]
    _last_stats.clear()
    _last_stats.update(median=med, min=samples[0], max=samples[-1], batches=len(samples),
                       calls_per_batch=per_batch)
    return med


def timeit_pair(fn, peer_fn, device="cpu", min_time: Optional[float] = None, warmup: int = 2,
                max_iters: int = 1000) -> tuple:
    """(median s per call of fn, of peer_fn), timing batches of the two alternately so that
    load that comes and goes on a shared machine affects both sides alike and the ratio stays
    fair. Each side gets at least min_time seconds of timed calls."""
    if min_time is None:
        min_time = _settings["min_time"]
    fns = (fn, peer_fn)
    per_batch, samples, spent = [], ([], []), [0.0, 0.0]
    for i, f in enumerate(fns):
        _warm(f, device, warmup, min_time)
        t0 = time.perf_counter()
        f()
        sync(device)
        one = max(time.perf_counter() - t0, 1e-7)
        per_batch.append(max(1, min(max_iters, int(0.05 / one))))
        if per_batch[-1] == 1:  # as in timeit: a slow call's calibration is a sample
            samples[i].append(one)
            spent[i] += one

    def done(i):
        return len(samples[i]) >= 50 or (spent[i] >= min_time and len(samples[i]) >= 3)

    while not (done(0) and done(1)):
        for i, f in enumerate(fns):
            if done(i):
                continue
            t0 = time.perf_counter()
            for _ in range(per_batch[i]):
                f()
            sync(device)
            dt = time.perf_counter() - t0
            samples[i].append(dt / per_batch[i])
            spent[i] += dt
    meds = []
    for x in samples:
        x.sort()
        meds.append(x[len(x) // 2])
    _last_stats.clear()
    _last_stats.update(median=meds[0], min=samples[0][0], max=samples[0][-1], batches=len(samples[0]),
                       calls_per_batch=per_batch[0], peer_median=meds[1], peer_min=samples[1][0])
    return meds[0], meds[1]


def last_timing() -> dict:
    """Spread of the latest timeit call: median, min, max (s), batches, calls_per_batch."""
    return dict(_last_stats)


# ---- machine limits, measured once per process ------------------------------------------------
# A limit is the best batch of its measurement, not the median: other load on the machine only
# ever slows a measurement down, and a limit that noise pulled down would flatter every figure.
# Cached on the normalised arguments, so copy_bandwidth("cpu") and copy_bandwidth(device="cpu")
# share one measurement between the suite and every benchmark module.
def _measured_once(fn):
    sig = inspect.signature(fn)
    cache: dict = {}

    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple((k, str(v)) for k, v in bound.arguments.items())
        if key not in cache:
            cache[key] = fn(*bound.args, **bound.kwargs)
        return cache[key]

    wrapper.cache_clear = cache.clear
    wrapper.__doc__ = fn.__doc__
    wrapper.__name__ = fn.__name__
    wrapper.__wrapped__ = fn
    return wrapper


def llc_bytes() -> int:
    """Size of the largest CPU cache (bytes), from sysfs; 32 MiB when it cannot be read."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in os.listdir(base):
            try:
                with open(os.path.join(base, idx, "size")) as f:
                    s = f.read().strip().upper()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
            digits = s.rstrip("KMG")
            if digits.isdigit():
                best = max(best, int(digits) * mult)
    except OSError:
        pass
    return best or (32 << 20)


def working_sets(bytes_per_call: int, factor: int = 4, cap: int = 64) -> int:
    """How many distinct copies of a benchmark's data to rotate through so that consecutive
    calls touch more than factor x the last-level cache: bandwidth figures then measure memory,
    not cache, and are comparable with copy_bandwidth / read_bandwidth."""
    return max(1, min(cap, math.ceil(factor * llc_bytes() / max(1, bytes_per_call))))


class Rotation:
    """Calls fn(i) with i = 0, 1, ..., n-1, 0, ... on successive calls (see working_sets)."""

    def __init__(self, fn: Callable[[int], object], n: int):
        self.fn, self.n, self.i = fn, max(1, n), 0

    def __call__(self):
        i = self.i
        self.i = (i + 1) % self.n
        return self.fn(i)


def stream_buffers(n: int, device="cpu", count: int = 1) -> list:
    """`count` fp32 buffers of n ones for the bandwidth measurements. On the CPU they lie on huge
    pages, as the runtime's weights and KV caches do (models/hugepages.py): on 4 KiB pages a
    2-vCPU Zen 2 guest streams ~26 GB/s against ~34 on huge pages, and a reference taken there
    would rate a kernel reading huge-page data a third closer to the limit than it is."""
    if torch.device(device).type != "cpu":
        return [torch.ones(n, device=device) for _ in range(count)]
    from ..models.hugepages import zeros_on_hugepages

    bufs = zeros_on_hugepages([(n,)] * count, torch.float32)
    for b in bufs:
        b.fill_(1.0)
    return bufs


def stream_read_rate(n: int, rounds: int, sums: int = 1, clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes/s of a torch sum over n fp32 (a stream buffer, on huge pages), measured afresh at each
    call: the best of `rounds` rounds of `sums` sums after one untimed, timed by `clock`
    (time.thread_time: the calling thread's CPU time, for one-thread benches)."""
    (a,) = stream_buffers(n)
    a.sum()
    best = float("inf")
    for _ in range(rounds):
        t = clock()
        for _ in range(sums):
            a.sum()
        best = min(best, (clock() - t) / sums)
    return n * 4 / best


@_measured_once
def copy_bandwidth(device="cpu", nbytes: int = 256 << 20) -> float:
    """Measured memory copy bandwidth in bytes/s (bytes read + bytes written): the better of
    torch copy_ and, on CPU, numpy's memcpy (which may use non-temporal stores)."""
    n = nbytes // 4
    a, b = stream_buffers(n, device, 2)
    timeit(lambda: b.copy_(a), device, min_time=0.5)
    best = _last_stats["min"]
    if not str(device).startswith("cuda"):
        import numpy as np

        an, bn = a.numpy(), b.numpy()
        timeit(lambda: np.copyto(bn, an), device, min_time=0.5)
        best = min(best, _last_stats["min"])
    return 2 * nbytes / best


@_measured_once
def read_bandwidth(device="cpu", nbytes: int = 256 << 20) -> float:
    """Measured memory read bandwidth in bytes/s (a sum over a large fp32 buffer, stream_buffers)."""
    n = nbytes // 4
    (a,) = stream_buffers(n, device)
    timeit(lambda: a.sum(), device, min_time=0.5)
    return nbytes / _last_stats["min"]


@_measured_once
def matmul_flops(dtype=torch.float32, device="cpu", n: Optional[int] = None) -> float:
    """Measured dense matmul FLOP/s for dtype (torch.mm, square n x n; n defaults to 1024 on CPU
    and 8192 on a GPU, where a 1024^3 product is too small to reach the tensor cores' peak)."""
    if n is None:
        n = 8192 if str(device).startswith("cuda") else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    timeit(lambda: a @ b, device, min_time=0.5)
    return 2 * n**3 / _last_stats["min"]


def compute_flops(dtype=torch.float32, device="cpu") -> float:
    """The FLOP/s a kernel computing in dtype can be held to: torch's matmul rate for dtype, and
    for a 16-bit dtype on the CPU at least the fp32 rate. Without bf16 or fp16 arithmetic in the
    CPU (AVX2, AVX-512 without AVX512_BF16) a kernel widens to fp32 and can reach the fp32 rate,
    while torch's own 16-bit matmul there can be a thousand times slower (0.7 GFLOP/s on an
    AVX2 Zen 2): held to that, every figure would read as far above 100% of the limit."""
    flops = matmul_flops(dtype, device)
    if dtype != torch.float32 and not str(device).startswith("cuda"):
        flops = max(flops, matmul_flops(torch.float32, device))
    return flops


# ---- records ---------------------------------------------------------------------------------
@dataclass
class Record:
    bench: str                  # e.g. "kvcache/reshape_and_cache_flash"
    case: str                   # shape / parameters
    llmkern_s: float
    peer: str
    peer_s: Optional[float]
    metric: str = ""            # e.g. "GB/s", "TFLOP/s", "tok/s"
    llmkern_value: Optional[float] = None
    limit: Optional[float] = None     # the machine's limit in the same unit (measured)
    extra: dict = field(default_factory=dict)
    axes: Axes = field(default_factory=dict)  # plot coordinates (see Axes)

    @property
    def ratio(self) -> Optional[float]:
        return None if not self.peer_s or not self.llmkern_s else self.peer_s / self.llmkern_s

    @property
    def limit_fraction(self) -> Optional[float]:
        """llmkern_value / limit; or extra["limit_fraction"] (alias "roofline_fraction") for a
        figure whose limit is not in the metric's unit (e.g. tok/s against matmul FLOP/s)."""
        if self.limit and self.llmkern_value is not None:
            return self.llmkern_value / self.limit
        for key in ("limit_fraction", "roofline_fraction"):
            if self.extra.get(key) is not None:
                return float(self.extra[key])
        return None

    @property
    def peer_value(self) -> Optional[float]:
        """The peer's figure in `metric`: extra["peer_value"] if given; for a rate ("GB/s",
        "tok/s", ...) the same work over the peer's time; for a time metric, the peer's time."""
        if self.extra.get("peer_value") is not None:
            return float(self.extra["peer_value"])
        if self.llmkern_value is None or not self.peer_s:
            return None
        if self.metric.endswith("/s"):
            return self.llmkern_value * self.llmkern_s / self.peer_s
        if self.is_time_metric:
            return self.llmkern_value * self.peer_s / self.llmkern_s
        return None

    @property
    def is_time_metric(self) -> bool:
        """The metric is a duration ("ms", "s", "ms TTFT", ...), so lower is better."""
        return self.metric.split(" ", 1)[0] in ("s", "ms", "us")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["limit_fraction"] = self.limit_fraction
        d["peer_value"] = self.peer_value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def fmt_seconds(s: Optional[float]) -> str:
    """A duration with a unit that keeps 3-4 significant digits (us, ms or s)."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"


def print_records(records) -> None:
    hdr = f"{'benchmark':38} {'case':34} {'llmkern':>11} {'peer':>11} {'ratio':>7} {'value':>12} {'% limit':>8}  peer name"
    print(hdr)
    print("-" * len(hdr))
    for r in records:
        peer = f"{r.peer_s * 1e3:9.3f}ms" if r.peer_s else "          -"
        ratio = f"{r.ratio:6.2f}x" if r.ratio else "      -"
        val = f"{r.llmkern_value:7.2f} {r.metric}" if r.llmkern_value is not None else ""
        frac = f"{100 * r.limit_fraction:7.1f}%" if r.limit_fraction is not None else ""
        print(f"{r.bench:38} {r.case:34} {r.llmkern_s * 1e3:9.3f}ms {peer} {ratio} {val:>12} {frac:>8}  {r.peer}")


def bench_cli(run: Callable[[bool, str], list], argv=None, device: str = "cpu") -> int:
    """The command line of a kernel bench module: `[--quick] [--device cpu|cuda]`, then its records."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default=device)
    args = ap.parse_args(argv)
    print_records(run(args.quick, args.device))
    return 0


def sanitizer_case(failures: list) -> Callable:
    """`case(name)`: a decorator for the compute-sanitizer drivers that runs the decorated launch group
    at once, synchronises, prints ok/FAIL and appends failing names to `failures` (the run goes on:
    a kernel that faults breaks the CUDA context, so the first failure is the culprit)."""

    def case(name):
        def deco(fn):
            try:
                fn()
                torch.cuda.synchronize()
                print(f"ok    {name}", flush=True)
            except Exception:  # noqa: BLE001  (report every kind of failure, keep going)
                failures.append(name)
                print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
            return fn
        return deco

    return case
