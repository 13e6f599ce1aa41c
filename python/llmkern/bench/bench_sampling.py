"""Sampling: llmkern's sorting-free kernels vs the best plain-torch implementation of the same
filter, GB/s of logits/probabilities read vs the measured read bandwidth.

Peers: softmax + multinomial (plain); topk first, then softmax + multinomial (top-k, and top-k +
top-p with cumsum over the k survivors); softmax + sort + cumsum + mask + multinomial (top-p, the
engines' path); max + mask + multinomial (min-p, from probabilities on both sides).

    python bench/bench_sampling.py [--quick] [--device cuda]
"""
from __future__ import annotations

import sys

import torch

import llmkern  # noqa: E402
from llmkern.bench.common import Record, bench_cli, read_bandwidth, timeit  # noqa: E402

TEMP, TOP_K, TOP_P, MIN_P = 0.7, 50, 0.9, 0.1


def torch_plain(logits):
    return torch.multinomial(torch.softmax(logits / TEMP, -1), 1)


def torch_top_k(logits):
    v, i = torch.topk(logits / TEMP, TOP_K, -1)
    return i.gather(1, torch.multinomial(torch.softmax(v, -1), 1))


def torch_top_p(logits):
    p = torch.softmax(logits / TEMP, -1)
    sp, si = torch.sort(p, -1, descending=True)
    c = torch.cumsum(sp, -1)
    sp = sp.masked_fill((c - sp) > TOP_P, 0.0)
    return si.gather(1, torch.multinomial(sp, 1))


def torch_top_k_top_p(logits):
    v, i = torch.topk(logits / TEMP, TOP_K, -1)  # sorted: the cumsum runs over the k survivors only
    p = torch.softmax(v, -1)
    c = torch.cumsum(p, -1)
    p = p.masked_fill((c - p) > TOP_P, 0.0)
    return i.gather(1, torch.multinomial(p, 1))


def torch_min_p(probs):
    p = probs.masked_fill(probs < MIN_P * probs.amax(-1, keepdim=True), 0.0)
    return torch.multinomial(p, 1)


def cases(logits, probs):
    """(name, llmkern call, peer name, peer call, input bytes read once)."""
    lk = llmkern
    seed = dict(seed=1, offset=0)
    return [
        ("plain", lambda: lk.sampling_from_logits(logits, temperature=TEMP, **seed),
         "torch softmax+multinomial", lambda: torch_plain(logits)),
        ("top-k 50", lambda: lk.top_k_top_p_sampling_from_logits(logits, TOP_K, 1.0, temperature=TEMP, **seed),
         "torch topk+softmax+multinomial", lambda: torch_top_k(logits)),
        ("top-p 0.9", lambda: lk.top_k_top_p_sampling_from_logits(logits, 0, TOP_P, temperature=TEMP, **seed),
         "torch softmax+sort+cumsum+multinomial", lambda: torch_top_p(logits)),
        ("top-k 50 + top-p 0.9", lambda: lk.top_k_top_p_sampling_from_logits(logits, TOP_K, TOP_P, temperature=TEMP, **seed),
         "torch topk+softmax+cumsum+multinomial", lambda: torch_top_k_top_p(logits)),
        ("min-p 0.1 (probs)", lambda: lk.min_p_sampling_from_probs(probs, MIN_P, **seed),
         "torch max+mask+multinomial", lambda: torch_min_p(probs)),
    ]


def run(quick: bool = False, device: str = "cpu") -> list:
    bw = read_bandwidth(device) / 1e9
    if quick:
        shapes = [(64, 49152), (1, 128256), (256, 32000)]
    else:
        shapes = [(r, v) for r in (1, 16, 64, 256) for v in (32000, 49152, 128256)]
    out = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for rows, vocab in shapes:
        logits = (torch.randn(rows, vocab, generator=g) * 2.0).to(device)
        probs = torch.softmax(logits / TEMP, -1)
        nbytes = rows * vocab * 4
        for name, fn, peer_name, peer in cases(logits, probs):
            if quick and rows == 256 and name not in ("plain", "top-k 50 + top-p 0.9"):
                continue
            t = timeit(fn, device, min_time=0.2)
            tp = timeit(peer, device, min_time=0.2, warmup=1)
            out.append(Record("sampling/" + name, f"{rows} x {vocab}", t, peer_name, tp, "GB/s",
                              nbytes / t / 1e9, bw, axes={"batch": rows, "series": f"vocab {vocab}"}))
    return out


def main(argv=None) -> int:
    return bench_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
