"""Shared benchmark plumbing: timing, machine limits measured in the same run, records.

Every benchmark reports llmkern next to a named peer measured in the same process, their ratio
(peer time / llmkern time, so > 1 means llmkern is faster) and, where it applies, the fraction of
the machine's limit (memory bandwidth or matmul FLOP/s) measured here, not quoted."""
from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch


def sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timeit(fn: Callable[[], object], device="cpu", min_time: float = 0.3, warmup: int = 2,
           max_iters: int = 1000) -> float:
    """Median seconds per call of fn (after warm-up), timing batches of calls for at least
    min_time seconds in total."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, min(max_iters, int(0.05 / one)))
    samples = []
    spent = 0.0
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
    return samples[len(samples) // 2]


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device="cpu", nbytes: int = 256 << 20) -> float:
    """Measured memory copy bandwidth in bytes/s (bytes read + bytes written), torch copy_."""
    n = nbytes // 4
    a = torch.ones(n, device=device)
    b = torch.empty_like(a)
    t = timeit(lambda: b.copy_(a), device, min_time=0.5)
    return 2 * nbytes / t


@functools.lru_cache(maxsize=None)
def read_bandwidth(device="cpu", nbytes: int = 256 << 20) -> float:
    """Measured memory read bandwidth in bytes/s (a sum over a large fp32 buffer)."""
    n = nbytes // 4
    a = torch.ones(n, device=device)
    t = timeit(lambda: a.sum(), device, min_time=0.5)
    return nbytes / t


@functools.lru_cache(maxsize=None)
def matmul_flops(dtype=torch.float32, device="cpu", n: int = 1024) -> float:
    """Measured dense matmul FLOP/s for dtype (torch.mm, square n x n)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = timeit(lambda: a @ b, device, min_time=0.5)
    return 2 * n**3 / t


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

    @property
    def ratio(self) -> Optional[float]:
        return None if not self.peer_s else self.peer_s / self.llmkern_s

    @property
    def limit_fraction(self) -> Optional[float]:
        if self.limit and self.llmkern_value is not None:
            return self.llmkern_value / self.limit
        return None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["limit_fraction"] = self.limit_fraction
        return d


def print_records(records) -> None:
    hdr = f"{'benchmark':38} {'case':34} {'llmkern':>11} {'peer':>11} {'ratio':>7} {'value':>10} {'% limit':>8}  peer name"
    print(hdr)
    print("-" * len(hdr))
    for r in records:
        peer = f"{r.peer_s * 1e3:9.3f}ms" if r.peer_s else "          -"
        ratio = f"{r.ratio:6.2f}x" if r.ratio else "      -"
        val = f"{r.llmkern_value:7.2f} {r.metric}" if r.llmkern_value is not None else ""
        frac = f"{100 * r.limit_fraction:7.1f}%" if r.limit_fraction is not None else ""
        print(f"{r.bench:38} {r.case:34} {r.llmkern_s * 1e3:9.3f}ms {peer} {ratio} {val:>10} {frac:>8}  {r.peer}")
