"""Attention: llmkern vs torch in the same run.

- prefill: flash_attn_varlen_func vs torch.nn.functional.scaled_dot_product_attention (causal),
  fp32 and bf16, 1 x 2048 and 8 x 512 tokens, 9q/3kv x 64 (SmolLM2) and 32q/8kv x 128 (Llama).
  The peer gets its preferred layout [b, H, S, D] with K/V already expanded to the query heads
  (its fastest path here), all prepared outside the timing. Also GFLOP/s vs measured matmul FLOP/s.
- paged decode: flash_attn_with_kvcache (block 16) vs torch gather through the block table +
  SDPA, 64 seqs x 1k and 4 seqs x 16k context, both head shapes; GB/s of K/V read vs the measured
  read bandwidth.
- SmolLM2 decode (9q/3kv x 64, block 16, fp32 and bf16): batch 1 / 4 / 32 x context 1k-4k, the
  shapes of a serving step. Calls rotate over enough copies of the cache to exceed the last-level
  cache (as a model's layers do), and each row carries its own read-bandwidth reference (a
  streaming sum over 256 MiB at the same thread count, the better of one measurement just before
  and one just after the row), so that on a shared machine the fraction compares like with like.
  With one thread (--threads 1) both are timed in the thread's CPU time (less disturbed by load).
- paged prefill: a 512-token chunk over a 4k cached prefix (flash_attn_varlen_func with
  block_table) vs torch gather + SDPA with the bottom-right causal mask.

    python bench/bench_attention.py [--quick] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # huge pages for the big K/V caches (before torch starts)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import llmkern  # noqa: E402
from llmkern.bench.common import (Record, Rotation, compute_flops, print_records, read_bandwidth,  # noqa: E402
                                  stream_read_rate, timeit, timeit_pair, working_sets)

HEADS = {"smollm2 9/3x64": (9, 3, 64), "llama 32/8x128": (32, 8, 128)}


def prefill_case(device, dtype, batch, seqlen, hq, hkv, d):
    """Equal-length causal prefill: (llmkern call, SDPA inputs (q, k, v) in [b, h, s, d] with K/V
    repeated per query head, FLOPs of QK^T + PV under the causal mask)."""
    total = batch * seqlen
    q = torch.randn(total, hq, d, device=device).to(dtype)
    k = torch.randn(total, hkv, d, device=device).to(dtype)
    v = torch.randn(total, hkv, d, device=device).to(dtype)
    cu = torch.arange(0, total + 1, seqlen, dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def ours():
        return llmkern.flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=True, out=out)

    g = hq // hkv
    qp = q.view(batch, seqlen, hq, d).transpose(1, 2).contiguous()
    kp = k.view(batch, seqlen, hkv, d).transpose(1, 2).repeat_interleave(g, 1).contiguous()
    vp = v.view(batch, seqlen, hkv, d).transpose(1, 2).repeat_interleave(g, 1).contiguous()
    flops = 4 * batch * hq * d * seqlen * (seqlen + 1) / 2
    return ours, (qp, kp, vp), flops


def _prefill(device, dtype, batch, seqlen, hq, hkv, d, min_time):
    ours, (qp, kp, vp), flops = prefill_case(device, dtype, batch, seqlen, hq, hkv, d)
    t = timeit(ours, device, min_time=min_time)
    tp = timeit(lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True), device, min_time=min_time)
    return t, tp, flops


def _paged_cache(device, dtype, nseq, ctx, hkv, d, bs):
    nblk = (ctx + bs - 1) // bs
    perm = torch.randperm(nseq * nblk, device=device).to(torch.int32)
    block_table = perm.view(nseq, nblk)
    kc = torch.randn(nseq * nblk, bs, hkv, d, device=device).to(dtype)
    vc = torch.randn_like(kc)
    return kc, vc, block_table


def _gather(cache, block_table, ctx):
    b = block_table.shape[0]
    return cache[block_table.long()].view(b, -1, cache.shape[2], cache.shape[3])[:, :ctx].transpose(1, 2)


def _decode(device, dtype, nseq, ctx, hq, hkv, d, bs, min_time):
    kc, vc, bt = _paged_cache(device, dtype, nseq, ctx, hkv, d, bs)
    q = torch.randn(nseq, 1, hq, d, device=device).to(dtype)
    lens = torch.full((nseq,), ctx, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    t = timeit(lambda: llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, out=out),
               device, min_time=min_time)
    qt = q.transpose(1, 2)

    def peer():
        kk, vv = _gather(kc, bt, ctx), _gather(vc, bt, ctx)
        return F.scaled_dot_product_attention(qt, kk, vv, enable_gqa=True)

    tp = timeit(peer, device, min_time=min_time)
    kv_bytes = 2 * nseq * ctx * hkv * d * kc.element_size()
    return t, tp, kv_bytes


SMOLLM2_DECODE = [(1, 1024), (1, 4096), (4, 1024), (4, 4096), (32, 1024), (32, 2048)]


def _smollm2_decode(device, dtype, nseq, ctx, min_time):
    """(llmkern s, peer s, K/V bytes per call) over rotated copies of a paged cache (see above)."""
    hq, hkv, d = HEADS["smollm2 9/3x64"]
    kv_bytes = 2 * nseq * ctx * hkv * d * torch.empty((), dtype=dtype).element_size()
    n = working_sets(kv_bytes) if device == "cpu" else 1
    sets = [_paged_cache(device, dtype, nseq, ctx, hkv, d, 16) for _ in range(n)]
    q = torch.randn(nseq, 1, hq, d, device=device).to(dtype)
    lens = torch.full((nseq,), ctx, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    qt = q.transpose(1, 2)

    def ours(i):
        kc, vc, bt = sets[i]
        return llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, out=out)

    def peer(i):
        kc, vc, bt = sets[i]
        return F.scaled_dot_product_attention(qt, _gather(kc, bt, ctx), _gather(vc, bt, ctx), enable_gqa=True)

    if _cpu_clock(device):
        return _thread_time_pair(Rotation(ours, n), Rotation(peer, n), min_time) + (kv_bytes,)
    t, tp = timeit_pair(Rotation(ours, n), Rotation(peer, n), device, min_time=min_time)
    return t, tp, kv_bytes


def _cpu_clock(device) -> bool:
    """One thread on CPU: time the calling thread's CPU time, which other processes on a shared
    machine disturb far less than wall time (as bench_decode_profile --threads 1)."""
    return device == "cpu" and llmkern.get_num_threads() == 1 and torch.get_num_threads() == 1


def _thread_time_pair(fn, peer_fn, min_time: float) -> tuple:
    """(best s per call of fn, of peer_fn) in thread CPU time, batches of the two alternating."""
    best = [float("inf"), float("inf")]
    spent = [0.0, 0.0]
    for f in (fn, peer_fn):
        f()
    while min(spent) < min_time or min(best) == float("inf"):
        for i, f in enumerate((fn, peer_fn)):
            t0 = time.thread_time()
            calls = 0
            while calls == 0 or time.thread_time() - t0 < 0.05:
                f()
                calls += 1
            dt = time.thread_time() - t0
            best[i] = min(best[i], dt / calls)
            spent[i] += dt
    return best[0], best[1]


def _read_bw_thread_time(nbytes: int = 256 << 20) -> float:
    """read_bandwidth's streaming sum, one thread, best of several in thread CPU time."""
    return stream_read_rate(nbytes // 4, 9, 1, time.thread_time)


def smollm2_decode_rows(device="cpu", quick=False, min_time=0.5) -> list:
    """The SmolLM2 decode rows (see the module docstring), each with its own bandwidth reference."""
    out = []
    if _cpu_clock(device):
        bw_now = lambda _device: _read_bw_thread_time()  # noqa: E731
    else:
        bw_now = getattr(read_bandwidth, "__wrapped__", read_bandwidth)  # a fresh measurement each time
    shapes = SMOLLM2_DECODE[::2] if quick else SMOLLM2_DECODE
    for dtype in (torch.float32, torch.bfloat16):
        dn = str(dtype).replace("torch.", "")
        for nseq, ctx in shapes:
            before = bw_now(device)
            t, tp, kv_bytes = _smollm2_decode(device, dtype, nseq, ctx, min_time)
            bw = max(before, bw_now(device)) / 1e9
            out.append(Record("attention/smollm2 decode", f"{dn} {nseq}x{ctx} 9/3x64 bs16", t,
                              "torch gather+SDPA", tp, "GB/s", kv_bytes / t / 1e9, bw,
                              extra={"read_gb_s": round(bw, 1), "threads": llmkern.get_num_threads(),
                                     "clock": "thread CPU time" if _cpu_clock(device) else "wall"},
                              axes={"batch": nseq, "seqlen": ctx, "series": f"{dn} smollm2 decode"}))
    return out


def _paged_prefill(device, dtype, chunk, prefix, hq, hkv, d, bs, min_time):
    ctx = prefix + chunk
    kc, vc, bt = _paged_cache(device, dtype, 1, ctx, hkv, d, bs)
    q = torch.randn(chunk, hq, d, device=device).to(dtype)
    cu_q = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, ctx], dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    t = timeit(lambda: llmkern.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, chunk, ctx, causal=True,
                                                      block_table=bt, out=out), device, min_time=min_time)
    qt = q.unsqueeze(0).transpose(1, 2)
    i = torch.arange(chunk, device=device)[:, None] + prefix
    mask = torch.arange(ctx, device=device)[None, :] <= i  # bottom-right aligned causal

    def peer():
        kk, vv = _gather(kc, bt, ctx), _gather(vc, bt, ctx)
        return F.scaled_dot_product_attention(qt, kk, vv, attn_mask=mask, enable_gqa=True)

    tp = timeit(peer, device, min_time=min_time)
    flops = 4 * hq * d * chunk * (prefix + (chunk + 1) / 2)
    return t, tp, flops


def run(quick: bool = False, device: str = "cpu") -> list:
    min_time = 0.2 if quick else 0.5
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        peak = compute_flops(dtype, device) / 1e9
        dn = str(dtype).replace("torch.", "")
        for name, (hq, hkv, d) in HEADS.items():
            for batch, seqlen in ([(1, 2048)] if quick else [(1, 2048), (8, 512)]):
                t, tp, flops = _prefill(device, dtype, batch, seqlen, hq, hkv, d, min_time)
                out.append(Record("attention/prefill causal", f"{dn} {batch}x{seqlen} {name}", t,
                                  "torch SDPA", tp, "GFLOP/s", flops / t / 1e9, peak,
                                  axes={"seqlen": seqlen, "batch": batch, "series": f"{dn} b{batch} {name}"}))
    bw = read_bandwidth(device) / 1e9
    for name, (hq, hkv, d) in HEADS.items():
        for dtype in (torch.bfloat16, torch.float32):
            dn = str(dtype).replace("torch.", "")
            for nseq, ctx in ([(64, 1024)] if quick else [(64, 1024), (4, 16384)]):
                t, tp, kv_bytes = _decode(device, dtype, nseq, ctx, hq, hkv, d, 16, min_time)
                heads = name.split()[1]
                out.append(Record("attention/paged decode", f"{dn} {nseq}x{ctx} {heads} bs16", t,
                                  "torch gather+SDPA", tp, "GB/s", kv_bytes / t / 1e9, bw,
                                  axes={"batch": nseq, "seqlen": ctx, "series": f"{dn} ctx {ctx} {heads} bs16"}))
    out += smollm2_decode_rows(device, quick, min_time)
    hq, hkv, d = HEADS["llama 32/8x128"]
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32):
        dn = str(dtype).replace("torch.", "")
        t, tp, flops = _paged_prefill(device, dtype, 512, 4096, hq, hkv, d, 16, min_time)
        out.append(Record("attention/paged prefill", f"{dn} 512 over 4k 32/8x128 bs16", t,
                          "torch gather+SDPA", tp, "GFLOP/s", flops / t / 1e9,
                          compute_flops(dtype, device) / 1e9))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="substring filter on the benchmark name")
    ap.add_argument("--smollm2-decode", action="store_true", help="only the SmolLM2 decode rows")
    ap.add_argument("--threads", type=int, default=0, help="llmkern and torch threads (0 = default)")
    args = ap.parse_args(argv)
    if args.threads:
        llmkern.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.smollm2_decode:
        print_records(smollm2_decode_rows(args.device, args.quick, 0.2 if args.quick else 0.5))
        return 0
    recs = run(args.quick, args.device)
    print_records([r for r in recs if args.only in r.bench])
    return 0


if __name__ == "__main__":
    sys.exit(main())
