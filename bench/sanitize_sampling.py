"""Launch every sampling CUDA kernel path once on small shapes, for compute-sanitizer (memcheck,
racecheck): probabilities and logits in fp32/fp16/bf16, aligned and misaligned rows, every filter
and filter order, greedy and degenerate rows, renormalisation and masking, chain speculative
sampling with and without draft probabilities, penalties through dense inputs, sorted id lists
(including the > 48 KiB shared-memory path) and the long-list fallback.

    compute-sanitizer --tool memcheck python bench/sanitize_sampling.py
    # or from another driver:  import sanitize_sampling; sanitize_sampling.register(case)

Exits non-zero if a call raised.
"""
from __future__ import annotations

import sys

import torch

import llmkern

DEV = "cuda"


def register(case):
    """Declares the sampling cases through `case(name)(fn)` (a decorator that runs fn)."""
    torch.manual_seed(0)
    V = 3001  # odd: a partial last vector; > one slab of the largest CTA
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        logits = (torch.randn(5, V + 1, device=DEV) * 3).to(dtype)
        for name, x in (("aligned", logits[:, :V]), ("misaligned", logits[:, 1:])):
            probs = torch.softmax(x.float(), -1).to(dtype)

            @case(f"sampling {dtype} {name}: plain / top-k / top-p / min-p / both orders")
            def _(x=x, probs=probs):
                seed = dict(seed=3, offset=1)
                llmkern.sampling_from_probs(probs, **seed)
                llmkern.sampling_from_logits(x, temperature=torch.tensor([0.0, 0.5, 1.0, 2.0, 0.7], device=DEV), **seed)
                llmkern.top_k_sampling_from_probs(probs, 20, **seed)
                llmkern.top_p_sampling_from_probs(probs, 0.8, **seed)
                llmkern.min_p_sampling_from_probs(probs, 0.1, **seed)
                for order in ("top_k_first", "joint"):
                    llmkern.top_k_top_p_sampling_from_logits(x, 30, 0.9, filter_apply_order=order, **seed)
                    llmkern.top_k_top_p_sampling_from_probs(probs, 30, 0.9, filter_apply_order=order, **seed)

            @case(f"renorm / mask {dtype} {name}")
            def _(x=x, probs=probs):
                llmkern.top_k_renorm_probs(probs, 25)
                llmkern.top_p_renorm_probs(probs, 0.7)
                llmkern.top_k_mask_logits(x, 25)

    @case("sampling: degenerate rows, indices, int64 outputs")
    def _():
        p = torch.softmax(torch.randn(4, 300, device=DEV), -1)
        p[1] = 0.0
        p[2, 5] = float("inf")
        p[3] = float("nan")
        idx = torch.tensor([0, 1, 2, 3, 0, 0], device=DEV)
        llmkern.top_k_top_p_sampling_from_probs(p, 5, 0.5, indices=idx, seed=0, offset=0, return_valid=True)
        llmkern.top_p_renorm_probs(p, 0.5)

    @case("chain_speculative_sampling: draft probs and one-hot drafts")
    def _():
        b, n, V2 = 5, 3, 1001
        target = torch.softmax(torch.randn(b, n + 1, V2, device=DEV), -1)
        draft = torch.softmax(torch.randn(b, n, V2, device=DEV), -1)
        ids = torch.randint(0, V2, (b, n), device=DEV)
        llmkern.chain_speculative_sampling(draft, ids, target, seed=1, offset=0)
        llmkern.chain_speculative_sampling(None, ids, target, seed=1, offset=0)

    @case("apply_penalties: dense, sorted ids (small / > 48 KiB), long-list fallback")
    def _():
        b, V2 = 3, 500
        for L, Lp in ((30, 12), (9000, 7000), (20000, 13000)):
            x = torch.randn(b, V2, device=DEV)
            oid = torch.randint(-1, V2 + 1, (b, L), device=DEV)
            pid = torch.randint(-1, V2, (b, Lp), device=DEV)
            llmkern.apply_penalties(x, None, 1.2, 0.1, 0.1, output_token_ids=oid, prompt_token_ids=pid)
        counts = torch.randint(0, 3, (b, V2), device=DEV)
        mask = torch.rand(b, V2, device=DEV) < 0.1
        llmkern.apply_penalties(torch.randn(b, V2, device=DEV).bfloat16(), counts, 1.2, 0.1, 0.1, prompt_mask=mask)
        llmkern.apply_penalties(torch.randn(b, V2, device=DEV), None, 1.2, 0.1, 0.1,
                                output_token_ids=torch.randint(0, V2, (b, 40), device=DEV), prompt_mask=mask)


if __name__ == "__main__":
    from llmkern.bench.common import sanitizer_case

    failures = []
    register(sanitizer_case(failures))
    sys.exit(1 if failures else 0)
