"""Grammar masks (token bitmasks): sampling with the mask fused into the kernel vs masking the
logits first with xgrammar's apply_token_bitmask_inplace (torch CPU) and sampling unmasked; the
unmasked draw for reference; llmkern's apply_token_bitmask_inplace vs xgrammar's. fp32 logits, a
mask allowing about 10% of the vocabulary. Peers are skipped when xgrammar is not installed.

    python -m llmkern.bench.bench_bitmask [--quick] [--device cuda]
"""
from __future__ import annotations

import sys

import torch

import llmkern
from llmkern.bench.common import Record, bench_cli, read_bandwidth, timeit

TEMP = 0.7
ROWS = 32


def random_bitmask(rows: int, vocab: int, frac: float, g: torch.Generator) -> torch.Tensor:
    allowed = torch.rand(rows, (vocab + 31) // 32 * 32, generator=g) < frac
    w = (allowed.view(rows, -1, 32).long() << torch.arange(32)).sum(-1)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def _xgrammar_apply():
    try:
        import xgrammar
    except ImportError:
        return None
    return xgrammar.apply_token_bitmask_inplace


def run(quick: bool = False, device: str = "cpu") -> list:
    bw = read_bandwidth(device) / 1e9
    xgr = _xgrammar_apply()
    seed = dict(seed=1, offset=0)
    g = torch.Generator().manual_seed(0)
    out = []
    for vocab in (49152, 128256):
        case, axes = f"{ROWS} x {vocab}", {"batch": ROWS, "series": f"vocab {vocab}"}
        nbytes = ROWS * vocab * 4
        mask = random_bitmask(ROWS, vocab, 0.1, g).to(device)
        logits = (torch.randn(ROWS, vocab, generator=g) * 2.0).to(device)
        masked = logits.clone()  # the peers mask it in place (again and again: idempotent)

        def fused():
            return llmkern.sampling_from_logits(logits, temperature=TEMP, token_bitmask=mask, **seed)

        def plain():
            return llmkern.sampling_from_logits(logits, temperature=TEMP, **seed)

        def mask_then_sample():
            xgr(masked, mask)
            return llmkern.sampling_from_logits(masked, temperature=TEMP, **seed)

        t = timeit(fused, device, min_time=0.3)
        tp = timeit(mask_then_sample, device, min_time=0.3) if xgr else None
        out.append(Record("bitmask/sample, fused mask", case, t, "xgrammar apply + sample", tp, "GB/s",
                          nbytes / t / 1e9, bw, axes=axes))
        t = timeit(plain, device, min_time=0.3)
        out.append(Record("bitmask/sample, no mask", case, t, "", None, "GB/s", nbytes / t / 1e9, bw, axes=axes))
        t = timeit(lambda: llmkern.ops.apply_token_bitmask_inplace(masked, mask), device, min_time=0.3)
        tp = timeit(lambda: xgr(masked, mask), device, min_time=0.3) if xgr else None
        out.append(Record("bitmask/apply_token_bitmask_inplace", case, t, "xgrammar apply_token_bitmask_inplace",
                          tp, "GB/s", nbytes / t / 1e9, bw, axes=axes))
    return out


def main(argv=None) -> int:
    return bench_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
