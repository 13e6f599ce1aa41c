"""Attention on a GPU: llmkern's CUDA kernels vs torch's GPU attention in the same run.

- prefill (causal, bf16): flash_attn_varlen_func vs torch SDPA pinned to its FLASH_ATTENTION
  and CUDNN_ATTENTION backends, [b, H, S, D] inputs prepared outside the timing; TFLOP/s vs the
  measured bf16 matmul TFLOP/s. hd128 32 heads x 4k is the issue's target shape.
- paged decode (bf16, Llama 32/8 x 128, block 16): flash_attn_with_kvcache vs torch gather
  through the block table + SDPA, and vs FlexAttention (compiled) on a dense, already gathered
  cache (the peer's best case: no gather); GB/s of K/V read vs the measured copy bandwidth.
- paged prefill: a 512-token chunk over a 4k cached prefix vs torch gather + SDPA.

    python bench/bench_attention_gpu.py [--quick] [--device cuda]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import llmkern  # noqa: E402
from llmkern.bench.bench_attention import _gather, _paged_cache, prefill_case  # noqa: E402  (same paged inputs and torch peer as on CPU)
from llmkern.bench.common import Record, bench_cli, copy_bandwidth, matmul_flops, timeit  # noqa: E402


def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, name))


def _time_peer(fn, device, min_time):
    """Seconds per call of a peer, or None when it cannot run here (backend unavailable)."""
    try:
        fn()
        torch.cuda.synchronize()
        return timeit(fn, device, min_time=min_time)
    except Exception as e:  # noqa: BLE001  (a missing backend is a result, not a crash)
        print(f"  peer unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        return None


def _prefill(device, batch, seqlen, hq, hkv, d, min_time, peak):
    ours, (qp, kp, vp), flops = prefill_case(device, torch.bfloat16, batch, seqlen, hq, hkv, d)
    t = timeit(ours, device, min_time=min_time)
    case = f"bf16 {batch}x{seqlen} {hq}/{hkv}x{d}"
    axes = {"seqlen": seqlen, "batch": batch, "series": f"bf16 b{batch} {hq}/{hkv}x{d}"}
    recs = []
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        def peer(backend=backend):
            with _sdpa_backend(backend):
                return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)

        tp = _time_peer(peer, device, min_time)
        recs.append(Record("attention/prefill causal", case, t, f"torch SDPA {backend.split('_')[0].lower()}",
                           tp, "TFLOP/s", flops / t / 1e12, peak, axes=axes))
    return recs


_flex = None


def _flex_attention():
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


def _decode(device, nseq, ctx, hq, hkv, d, bs, min_time, bw, with_flex):
    kc, vc, bt = _paged_cache(device, torch.bfloat16, nseq, ctx, hkv, d, bs)
    q = torch.randn(nseq, 1, hq, d, device=device, dtype=torch.bfloat16)
    lens = torch.full((nseq,), ctx, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    t = timeit(lambda: llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, out=out),
               device, min_time=min_time)
    kv_bytes = 2 * nseq * ctx * hkv * d * kc.element_size()
    case = f"bf16 {nseq}x{ctx} {hq}/{hkv}x{d} bs{bs}"
    axes = {"batch": nseq, "seqlen": ctx, "series": f"bf16 ctx {ctx} {hq}/{hkv}x{d} bs{bs}"}
    qt = q.transpose(1, 2)

    def gather_sdpa():
        return F.scaled_dot_product_attention(qt, _gather(kc, bt, ctx), _gather(vc, bt, ctx), enable_gqa=True)

    recs = [Record("attention/paged decode", case, t, "torch gather+SDPA", _time_peer(gather_sdpa, device, min_time),
                   "GB/s", kv_bytes / t / 1e9, bw, axes=axes)]
    if with_flex:
        kd, vd = _gather(kc, bt, ctx).contiguous(), _gather(vc, bt, ctx).contiguous()
        flex = None
        try:
            flex = _flex_attention()
        except Exception as e:  # noqa: BLE001
            print(f"  FlexAttention unavailable: {e}", file=sys.stderr)
        tp = _time_peer(lambda: flex(qt, kd, vd, enable_gqa=True), device, min_time) if flex else None
        recs.append(Record("attention/paged decode", case, t, "FlexAttention (dense, no gather)", tp,
                           "GB/s", kv_bytes / t / 1e9, bw, axes=axes))
    return recs


def _paged_prefill(device, chunk, prefix, hq, hkv, d, bs, min_time, peak):
    ctx = prefix + chunk
    kc, vc, bt = _paged_cache(device, torch.bfloat16, 1, ctx, hkv, d, bs)
    q = torch.randn(chunk, hq, d, device=device, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, ctx], dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    t = timeit(lambda: llmkern.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, chunk, ctx, causal=True,
                                                      block_table=bt, out=out), device, min_time=min_time)
    qt = q.unsqueeze(0).transpose(1, 2)
    mask = torch.arange(ctx, device=device)[None, :] <= torch.arange(chunk, device=device)[:, None] + prefix

    def peer():
        return F.scaled_dot_product_attention(qt, _gather(kc, bt, ctx), _gather(vc, bt, ctx), attn_mask=mask,
                                              enable_gqa=True)

    flops = 4 * hq * d * chunk * (prefix + (chunk + 1) / 2)
    return [Record("attention/paged prefill", f"bf16 {chunk} over {prefix} {hq}/{hkv}x{d} bs{bs}", t,
                   "torch gather+SDPA", _time_peer(peer, device, min_time), "TFLOP/s", flops / t / 1e12, peak)]


def run(quick: bool = False, device: str = "cuda") -> list:
    if not str(device).startswith("cuda"):
        raise SystemExit("bench_attention_gpu.py compares GPU kernels: run it with --device cuda")
    min_time = 0.1 if quick else 0.3
    peak = matmul_flops(torch.bfloat16, device, n=8192) / 1e12
    bw = copy_bandwidth(device, nbytes=1 << 30) / 1e9
    out = []
    prefill = [(1, 4096, 32, 32, 128), (1, 4096, 32, 8, 128), (4, 2048, 32, 32, 64), (1, 4096, 16, 16, 256)]
    for shape in prefill[:2] if quick else prefill:
        out += _prefill(device, *shape, min_time, peak)
    decode = [(64, 4096), (64, 1024), (4, 16384), (8, 32768)]
    for i, (nseq, ctx) in enumerate(decode[:2] if quick else decode):
        out += _decode(device, nseq, ctx, 32, 8, 128, 16, min_time, bw, with_flex=(i == 0))
    out += _paged_prefill(device, 512, 4096, 32, 8, 128, 16, min_time, peak)
    return out


def main(argv=None) -> int:
    return bench_cli(run, argv, device="cuda")


if __name__ == "__main__":
    sys.exit(main())
