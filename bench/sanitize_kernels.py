"""Launch every llmkern CUDA kernel once on small shapes, for compute-sanitizer (memcheck,
racecheck) in bench/device_check.sh. Shapes are chosen so that each kernel path runs: partial
tiles, ragged and empty sequences, odd page sizes, padded head dims, split-KV.

    compute-sanitizer --tool memcheck python bench/sanitize_kernels.py

Prints one line per launch group and exits non-zero if a call raised (a kernel that faults
makes the CUDA context unusable, so later calls raise too: the first failure is the culprit).
"""
from __future__ import annotations

import sys

import torch

import llmkern
from llmkern.bench.common import sanitizer_case

DEV = "cuda"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
failures = []
case = sanitizer_case(failures)


def rnd(*shape, dtype=BF16):
    return torch.randn(*shape, device=DEV).to(dtype)


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)


def paged(nseq, max_len, hkv, d, bs, dtype):
    nblk = (max_len + bs - 1) // bs
    kc = rnd(nseq * nblk + 2, bs, hkv, d, dtype=dtype)
    bt = torch.randperm(nseq * nblk + 2, device=DEV)[: nseq * nblk].view(nseq, nblk).int()
    return kc, torch.randn_like(kc), bt


# ---- attention: tensor-core prefill (head-dim classes 64 / 128 / 256, padded dims) ----------
for dtype, d in ((BF16, 64), (FP16, 128), (BF16, 256), (BF16, 80)):
    @case(f"flash_attn_varlen prefill {dtype} hd{d} causal ragged")
    def _(dtype=dtype, d=d):
        lq, lk = [70, 0, 33], [90, 5, 33]
        q, k, v = rnd(sum(lq), 4, d, dtype=dtype), rnd(sum(lk), 2, d, dtype=dtype), rnd(sum(lk), 2, d, dtype=dtype)
        llmkern.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 70, 90, causal=True, return_softmax_lse=True)


@case("flash_attn_varlen paged prefill bf16 page 5, window, alibi, softcap")
def _():
    kc, vc, bt = paged(2, 120, 2, 64, 5, BF16)
    lq, lk = [40, 17], [120, 60]
    q = rnd(sum(lq), 6, 64)
    llmkern.flash_attn_varlen_func(q, kc, vc, cu(lq), cu(lk), 40, 120, causal=True, window_size=(30, 0),
                                   softcap=5.0, alibi_slopes=torch.rand(6, device=DEV), block_table=bt)


@case("flash_attn_varlen fp32 (CUDA-core kernel), paged 3")
def _():
    kc, vc, bt = paged(2, 50, 2, 96, 3, FP32)
    lq, lk = [20, 3], [50, 7]
    llmkern.flash_attn_varlen_func(rnd(sum(lq), 4, 96, dtype=FP32), kc, vc, cu(lq), cu(lk), 20, 50,
                                   causal=True, block_table=bt)


# ---- attention: decode-shaped kernel, split-KV + combine, append ----------------------------
for dtype, d, s, splits in ((BF16, 128, 1, 1), (FP16, 64, 2, 3), (BF16, 256, 1, 4), (FP32, 128, 1, 3),
                            (BF16, 64, 8, 2)):
    @case(f"flash_attn_with_kvcache {dtype} hd{d} s={s} splits={splits} append")
    def _(dtype=dtype, d=d, s=s, splits=splits):
        kc, vc, bt = paged(3, 300, 2, d, 16, dtype)
        q = rnd(3, s, 16 if s == 8 else 8, d, dtype=dtype)
        knew, vnew = rnd(3, s, 2, d, dtype=dtype), rnd(3, s, 2, d, dtype=dtype)
        lens = torch.tensor([0, 100, 280], dtype=torch.int32, device=DEV)
        llmkern.flash_attn_with_kvcache(q, kc, vc, k=knew, v=vnew, cache_seqlens=lens, block_table=bt,
                                        causal=True, num_splits=splits, return_softmax_lse=True)


@case("flash_attn_with_kvcache dense cache bf16 auto splits")
def _():
    kc, vc = rnd(2, 2048, 2, 128), rnd(2, 2048, 2, 128)
    llmkern.flash_attn_with_kvcache(rnd(2, 1, 8, 128), kc, vc,
                                    cache_seqlens=torch.tensor([2000, 77], dtype=torch.int32, device=DEV))


# ---- KV-cache ops -----------------------------------------------------------------------------
@case("reshape_and_cache_flash + copy_blocks + swap_blocks")
def _():
    kc, vc = rnd(8, 16, 2, 128), rnd(8, 16, 2, 128)
    slots = torch.tensor([0, 17, -1, 100], device=DEV)
    llmkern.reshape_and_cache_flash(rnd(4, 2, 128), rnd(4, 2, 128), kc, vc, slots)
    llmkern.copy_blocks([kc], [vc], torch.tensor([[0, 5], [1, 6]], device=DEV))
    host = torch.empty(8, 16, 2, 128, dtype=BF16).pin_memory()
    llmkern.swap_blocks(kc, host, torch.tensor([[2, 3]]))


# ---- sampling (whatever the build exposes) ------------------------------------------------------
SAMPLING = [n for n in getattr(llmkern.ops, "__all__", []) if "sampling" in n or n.endswith(("_probs", "_logits"))]


@case(f"sampling ops: {', '.join(SAMPLING) or 'none in this build'}")
def _():
    if not SAMPLING:
        return
    probs = torch.softmax(torch.randn(4, 1000, device=DEV), -1)
    logits = torch.randn(4, 1000, device=DEV)
    tries = {
        "sampling_from_probs": lambda f: f(probs),
        "sampling_from_logits": lambda f: f(logits),
        "top_k_sampling_from_probs": lambda f: f(probs, 10),
        "top_p_sampling_from_probs": lambda f: f(probs, 0.9),
        "min_p_sampling_from_probs": lambda f: f(probs, 0.1),
        "top_k_top_p_sampling_from_logits": lambda f: f(logits, 10, 0.9),
        "top_k_top_p_sampling_from_probs": lambda f: f(probs, 10, 0.9),
        "top_k_mask_logits": lambda f: f(logits, 10),
        "top_p_renorm_probs": lambda f: f(probs, 0.9),
        "top_k_renorm_probs": lambda f: f(probs, 10),
    }
    draft = torch.softmax(torch.randn(2, 3, 100, device=DEV), -1)
    target = torch.softmax(torch.randn(2, 4, 100, device=DEV), -1)
    ids = torch.multinomial(draft.view(-1, 100), 1).view(2, 3).int()
    tries["chain_speculative_sampling"] = lambda f: f(draft, ids, target)
    for name in SAMPLING:
        if name not in tries:
            continue
        try:
            tries[name](getattr(llmkern, name))
        except NotImplementedError as e:  # an op without a CUDA kernel in this build: nothing to check
            print(f"      {name}: skipped ({str(e).splitlines()[0][:80]})")


# every sampling kernel path (dtypes, misaligned rows, filters, degenerate rows, penalties)
import sanitize_sampling  # noqa: E402  (bench/ is the script's directory)

sanitize_sampling.register(case)


if __name__ == "__main__":
    print(f"{len(failures)} failing launch groups" if failures else "all launch groups ran")
    sys.exit(1 if failures else 0)
