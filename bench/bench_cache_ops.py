"""KV-cache ops: llmkern vs the equivalent torch indexing code, GB/s vs measured copy bandwidth.

    python bench/bench_cache_ops.py [--quick] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmkern  # noqa: E402
from common import Record, copy_bandwidth, print_records, timeit  # noqa: E402


def run(quick: bool = False, device: str = "cpu") -> list:
    bw = copy_bandwidth(device) / 1e9
    out = []
    dtype = torch.bfloat16
    es = 2
    # reshape_and_cache_flash: a prefill chunk of tokens written into a paged cache (Llama-8B layer)
    for tokens, heads, hd, bs in ([(2048, 8, 128, 16)] if quick else [(256, 8, 128, 16), (2048, 8, 128, 16), (8192, 8, 128, 16)]):
        nb = tokens // bs * 2
        kc = torch.zeros(nb, bs, heads, hd, dtype=dtype, device=device)
        vc = torch.zeros_like(kc)
        k = torch.randn(tokens, heads, hd, device=device).to(dtype)
        v = torch.randn_like(k)
        slots = torch.randperm(nb * bs, device=device)[:tokens]
        t = timeit(lambda: llmkern.reshape_and_cache_flash(k, v, kc, vc, slots), device)

        def peer():
            kc.view(-1, heads, hd).index_copy_(0, slots, k)
            vc.view(-1, heads, hd).index_copy_(0, slots, v)

        tp = timeit(peer, device)
        moved = 2 * 2 * tokens * heads * hd * es  # K and V, read + write
        out.append(Record("kvcache/reshape_and_cache_flash", f"{tokens}tok {heads}x{hd} bs{bs}", t,
                          "torch index_copy_", tp, "GB/s", moved / t / 1e9, bw))
    # copy_blocks: copy-on-write of many blocks across all layers
    layers, bs, heads, hd = 24, 16, 8, 128
    for pairs in ([256] if quick else [32, 256, 1024]):
        nb = 2 * pairs + 8
        kcs = [torch.randn(nb, bs, heads, hd, device=device).to(dtype) for _ in range(layers)]
        vcs = [c.clone() for c in kcs]
        perm = torch.randperm(nb)
        mapping = torch.stack([perm[:pairs], perm[pairs:2 * pairs]], 1).to(device)
        t = timeit(lambda: llmkern.copy_blocks(kcs, vcs, mapping), device)
        src, dst = mapping[:, 0], mapping[:, 1]

        def peer():
            for c in kcs + vcs:
                c[dst] = c[src]

        tp = timeit(peer, device)
        moved = 2 * layers * 2 * pairs * bs * heads * hd * es
        out.append(Record("kvcache/copy_blocks", f"{layers}L {pairs} pairs bs{bs}", t,
                          "torch index assign", tp, "GB/s", moved / t / 1e9, bw))
    # swap_blocks: offload / bring back blocks of one layer
    for pairs in ([256] if quick else [64, 512]):
        nb = pairs * 2
        src = torch.randn(nb, bs, heads, hd, device=device).to(dtype)
        dst = torch.empty_like(src, device="cpu")
        mapping = torch.stack([torch.randperm(nb)[:pairs], torch.randperm(nb)[:pairs]], 1)
        t = timeit(lambda: llmkern.swap_blocks(src, dst, mapping), device)
        s_idx, d_idx = mapping[:, 0].to(device), mapping[:, 1]

        def peer():
            dst[d_idx] = src[s_idx].to("cpu")

        tp = timeit(peer, device)
        moved = 2 * pairs * bs * heads * hd * es
        out.append(Record("kvcache/swap_blocks", f"{pairs} blocks {device}->cpu", t,
                          "torch index + copy", tp, "GB/s", moved / t / 1e9, bw))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    print(f"copy bandwidth ({a.device}): {copy_bandwidth(a.device) / 1e9:.1f} GB/s (read+write)")
    print_records(run(a.quick, a.device))
