"""CPU projections in bf16: llmkern's packed GEMM (linear_packed on pack_linear_weight_bf16) vs
torch's bf16 F.linear (oneDNN on torch's threads), side by side at SmolLM2-135M's shapes.

    python bench/bench_linear.py [--quick] [--peak-gflops X]

K = 576 (hidden) with N = 576 (o_proj), 192 (k/v), 3072 (the fused gate/up) and 49152 (the LM
head), rows M = 1 (batch-1 decode), 2, 4, 8, 32 (batched decode), 256, 1024 (prefill). Weights rotate
through several copies that together exceed the last-level cache (working_sets), so thin-M figures
read W from memory as a decode step does. For M <= 8 the GEMV (linear_small_m, W unpacked) is timed
too: extra["gemv_s"].

The limit is the machine's peak for the path `build_info()` names for bf16 linears: threads x FLOP
per cycle (1024 for AMX tiles; 64 for one 512-bit vdpbf16ps; 32 where bf16 is widened to fp32: two
256-bit FMAs, as on AVX2 cores and on Zen 4's AVX-512) x the clock /proc/cpuinfo reports (base
clock: with turbo the true peak is higher), and never below torch's matmul rate measured in the
same run (`compute_flops`). --peak-gflops overrides it. llmkern and torch are timed in alternating
batches (timeit_pair), so load from other processes weighs on both.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import llmkern
from llmkern.bench.common import Record, Rotation, compute_flops, print_records, timeit, timeit_pair, working_sets

K = 576
SHAPES = {576: "o_proj", 192: "k/v", 3072: "gate/up", 49152: "lm_head"}
ROWS = (1, 2, 4, 8, 32, 256, 1024)


def flop_per_cycle() -> int:
    """Per core, for the bf16 linear path of this process (build_info's cpu_kernels)."""
    path = llmkern.build_info().get("cpu_kernels", {}).get("linear bf16", "")
    if path.startswith("amx-bf16") and "emulated" not in path:
        return 1024  # one 16x16x32 tile product per 16 cycles
    if path.startswith("avx512-bf16"):
        return 64
    return 32


def _clock_ghz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        return max(mhz) / 1e3 if mhz else 2.5
    except OSError:
        return 2.5


def bf16_peak_gflops() -> float:
    threads = llmkern.build_info().get("num_threads") or len(os.sched_getaffinity(0))
    return max(threads * flop_per_cycle() * _clock_ghz(), compute_flops(torch.bfloat16) / 1e9)


def bench_bf16(quick: bool, peak: float) -> list:
    out = []
    rows = (1, 32, 256) if quick else ROWS
    shapes = (576, 3072) if quick else tuple(SHAPES)
    for n in shapes:
        wbytes = n * K * 2
        sets = working_sets(wbytes, cap=16)
        ws = [(torch.randn(n, K) / K**0.5).bfloat16() for _ in range(sets)]
        packed = [llmkern.pack_linear_weight_bf16(w) for w in ws]
        for m in rows:
            if m * n > (1 << 25):  # the [1024, 49152] logits: not a shape a runtime computes
                continue
            x = torch.randn(m, K).bfloat16()
            t, tp = timeit_pair(Rotation(lambda i: llmkern.linear_packed(x, packed[i], n), sets),
                                Rotation(lambda i: F.linear(x, ws[i]), sets))
            flops = 2 * m * n * K
            extra = {"working_sets": sets, "threads": torch.get_num_threads(), "headline": m in (1, 32, 256)}
            if m <= 8:
                extra["gemv_s"] = timeit(Rotation(lambda i: llmkern.linear_small_m(x, ws[i]), sets))
            out.append(Record("linear/linear_packed bf16", f"M={m} N={n} K={K} ({SHAPES[n]})", t,
                              "torch bf16 F.linear", tp, "GFLOP/s", flops / t / 1e9, peak, extra,
                              {"batch": m, "series": f"bf16 N={n}"}))
        del ws, packed
    return out


def run(quick: bool = False, device: str = "cpu", peak: float = 0.0) -> list:
    if device != "cpu":
        return []  # a CPU kernel (CUDA bf16 projections stay on cuBLAS)
    return bench_bf16(quick, peak or bf16_peak_gflops())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peak-gflops", type=float, default=0.0, help="the machine's bf16 peak (default: estimated)")
    a = ap.parse_args(argv)
    peak = a.peak_gflops or bf16_peak_gflops()
    print(f"bf16 peak assumed: {peak:.0f} GFLOP/s ({flop_per_cycle()} FLOP/cycle x {_clock_ghz():.2f} GHz x threads, "
          f"or torch's measured rate if higher); "
          f"load average {os.getloadavg()[0]:.2f}")
    recs = run(a.quick, "cpu", peak)
    print_records(recs)
    for r in recs:
        if "gemv_s" in r.extra:
            print(f"  {r.case}: packed {r.llmkern_s * 1e6:.1f} us, GEMV {r.extra['gemv_s'] * 1e6:.1f} us "
                  f"(GEMV/packed {r.extra['gemv_s'] / r.llmkern_s:.2f}x)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
