"""KV-cache ops: llmkern vs the equivalent torch indexing code, GB/s vs measured copy bandwidth.

    python bench/bench_cache_ops.py [--quick] [--device cuda]

Bandwidth accounting: bytes moved = bytes read + bytes written by the op itself (K and V rows,
not the small index tensors), the same convention as copy_bandwidth. Successive calls rotate
through several distinct working sets (different inputs / slots / block pairs) whose total is
well above the last-level cache, so the figures are memory bandwidth, comparable with the
measured limit, and not cache bandwidth. llmkern and the peer are timed in alternating batches
(timeit_pair), so that other load on the machine weighs on both alike.
"""
from __future__ import annotations

import argparse
import sys

import torch

import llmkern  # noqa: E402
from llmkern.bench.common import Record, Rotation, copy_bandwidth, print_records, timeit, timeit_pair, working_sets  # noqa: E402


def _transfer_limit(src_device: str) -> float:
    """Bytes/s (read + write) a plain copy reaches between the devices swap_blocks connects."""
    if src_device == "cpu":
        return copy_bandwidth("cpu")
    n = (256 << 20) // 4
    a = torch.ones(n, device=src_device)
    b = torch.empty(n, pin_memory=True)
    return 2 * (256 << 20) / timeit(lambda: b.copy_(a, non_blocking=True), src_device, min_time=0.3)


def bench_reshape_and_cache(quick: bool, device: str, bw: float) -> list:
    out = []
    dtype, es = torch.bfloat16, 2
    # tokens written into a paged cache (one Llama-8B layer: 8 kv heads x 128): a decode step of
    # 64 sequences (per-call overhead matters) and prefill chunks (bandwidth matters)
    shapes = [(2048, 8, 128, 16)] if quick else [(64, 8, 128, 16), (256, 8, 128, 16), (2048, 8, 128, 16), (8192, 8, 128, 16)]
    for tokens, heads, hd, bs in shapes:
        moved = 2 * 2 * tokens * heads * hd * es  # K and V, read + write
        n = working_sets(moved)
        nb = (2 * n * tokens + bs - 1) // bs  # cache at half occupancy across all working sets
        kc = torch.zeros(nb, bs, heads, hd, dtype=dtype, device=device)
        vc = torch.zeros_like(kc)
        ks = [torch.randn(tokens, heads, hd, device=device).to(dtype) for _ in range(n)]
        vs = [torch.randn_like(k) for k in ks]
        perm = torch.randperm(nb * bs, device=device)
        slots = [perm[i * tokens:(i + 1) * tokens].clone() for i in range(n)]
        kflat, vflat = kc.view(-1, heads, hd), vc.view(-1, heads, hd)

        def peer(i):
            kflat.index_copy_(0, slots[i], ks[i])
            vflat.index_copy_(0, slots[i], vs[i])

        t, tp = timeit_pair(Rotation(lambda i: llmkern.reshape_and_cache_flash(ks[i], vs[i], kc, vc, slots[i]), n),
                            Rotation(peer, n), device)
        out.append(Record("kvcache/reshape_and_cache_flash", f"{tokens}tok {heads}x{hd} bf16 bs{bs}", t,
                          "torch index_copy_", tp, "GB/s", moved / t / 1e9, bw,
                          {"working_sets": n, "bytes_per_call": moved, "headline": tokens == 2048}))
        del kc, vc, ks, vs, kflat, vflat
    return out


def bench_copy_blocks(quick: bool, device: str, bw: float) -> list:
    out = []
    dtype, es = torch.bfloat16, 2
    bs, heads, hd = 16, 8, 128
    block = bs * heads * hd * es
    # copy-on-write of many blocks across all layers (a forked beam / parallel sampling)
    for layers, pairs in ([(8, 256)] if quick else [(24, 32), (24, 256), (8, 1024)]):
        moved = 2 * layers * 2 * pairs * block  # K and V of every layer, read + write
        n = working_sets(moved)
        nb = 2 * n * pairs + 8
        kcs = [torch.randn(nb, bs, heads, hd, device=device).to(dtype) for _ in range(layers)]
        vcs = [c.clone() for c in kcs]
        perm = torch.randperm(nb)
        maps = [torch.stack([perm[2 * i * pairs:(2 * i + 1) * pairs], perm[(2 * i + 1) * pairs:(2 * i + 2) * pairs]], 1).to(device)
                for i in range(n)]
        def peer(i):
            src, dst = maps[i][:, 0], maps[i][:, 1]
            for c in kcs + vcs:
                c[dst] = c[src]

        t, tp = timeit_pair(Rotation(lambda i: llmkern.copy_blocks(kcs, vcs, maps[i]), n), Rotation(peer, n), device)
        out.append(Record("kvcache/copy_blocks", f"{layers}L {pairs} pairs bf16 bs{bs}", t,
                          "torch index assign", tp, "GB/s", moved / t / 1e9, bw,
                          {"working_sets": n, "bytes_per_call": moved, "headline": pairs == 256}))
        del kcs, vcs
    return out


def bench_swap_blocks(quick: bool, device: str) -> list:
    out = []
    dtype, es = torch.bfloat16, 2
    bs, heads, hd = 16, 8, 128
    block = bs * heads * hd * es
    limit = _transfer_limit(device) / 1e9
    # offload blocks of one layer to host memory (the CPU tier of the prefix cache)
    for pairs in ([256] if quick else [64, 512]):
        moved = 2 * pairs * block  # read + write
        n = working_sets(moved)
        nb = n * pairs
        src = torch.randn(nb, bs, heads, hd, device=device).to(dtype)
        dst = torch.empty(nb, bs, heads, hd, dtype=dtype, pin_memory=device != "cpu")
        maps = [torch.stack([torch.randperm(nb)[:pairs], torch.randperm(nb)[:pairs]], 1) for _ in range(n)]
        idx = [(m[:, 0].to(device), m[:, 1]) for m in maps]

        def peer(i):
            s_idx, d_idx = idx[i]
            dst[d_idx] = src[s_idx].to("cpu")

        t, tp = timeit_pair(Rotation(lambda i: llmkern.swap_blocks(src, dst, maps[i]), n), Rotation(peer, n), device)
        out.append(Record("kvcache/swap_blocks", f"{pairs} blocks {device}->cpu bf16", t,
                          "torch index + copy", tp, "GB/s", moved / t / 1e9, limit,
                          {"working_sets": n, "bytes_per_call": moved, "headline": pairs in (256, 512)}))
        del src, dst
    return out


def run(quick: bool = False, device: str = "cpu") -> list:
    bw = copy_bandwidth(device) / 1e9
    return (bench_reshape_and_cache(quick, device, bw) + bench_copy_blocks(quick, device, bw)
            + bench_swap_blocks(quick, device))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    print(f"copy bandwidth ({a.device}): {copy_bandwidth(a.device) / 1e9:.1f} GB/s (read+write)")
    print_records(run(a.quick, a.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
