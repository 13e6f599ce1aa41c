"""Fused MoE: llmkern.fused_moe vs the torch paths in the same run, on Mixtral-like shapes scaled to
one machine (8 experts, top-2, hidden 1024, intermediate 2816), fp32 and bf16.

Peers, each given the same hidden states, weights and routing (prepared outside the timing):
- "HF expert loop": the loop of Hugging Face's Mixtral sparse-MoE block: for each expert that has
  tokens, torch.where over the one-hot routing, index the rows, gate/up/down linears, scale by the
  routing weight, index_add_ into the output.
- "dense all-experts": every expert on every token (torch.bmm over [E, T, H]), combined with a
  dense [T, E] routing matrix (zeros where an expert was not chosen). Decode and 512 tokens only.
llmkern runs on experts packed once at load time (pack_moe_weights, as the MoE layer packs them:
fp32 panels for fp32, bf16 panels in k pairs for bf16 on the bf16 GEMM, AMX tiles where present)
and, for bf16, also on the bf16 weights as they are.

Decode (1 .. 64 tokens) reports GB/s of expert weights read (distinct experts hit x their bytes in
the layout llmkern reads) against the measured read bandwidth; prefill (512 .. 2048 tokens) reports
GFLOP/s against the measured matmul FLOP/s.

End to end: batch-1 decode tok/s of a small Mixtral-shaped random model (bench_moe_parallel's
MODEL), llmkern's engine vs transformers' generate in the same run; skipped with a note when this
llmkern has no MoE models or transformers is missing.

    python bench/bench_moe.py [--quick] [--device cpu]
"""
from __future__ import annotations

import dataclasses
import sys

import torch
import torch.nn.functional as F

import llmkern
from llmkern.bench.common import Record, bench_cli, compute_flops, read_bandwidth, timeit, timeit_pair
from llmkern.models.hugepages import move_to_hugepages

E, K, H, I = 8, 2, 1024, 2816


def hf_expert_loop(x, w13, w2, topk_weights, topk_ids):
    """The expert loop of transformers' MixtralSparseMoeBlock.forward after the router."""
    out = torch.zeros_like(x)
    mask = F.one_hot(topk_ids.long(), num_classes=w13.shape[0]).permute(2, 1, 0)
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit.flatten().tolist():
        idx, top_x = torch.where(mask[e])
        cur = x[top_x]
        h = F.silu(F.linear(cur, w13[e, :I])) * F.linear(cur, w13[e, I:])
        h = F.linear(h, w2[e]) * topk_weights[top_x, idx, None].to(x.dtype)
        out.index_add_(0, top_x, h)
    return out


def dense_all_experts(x, w13, w2, routing):
    """Every expert on every token, weighted by the dense routing matrix [T, E]."""
    xe = x.unsqueeze(0).expand(w13.shape[0], -1, -1)
    g = torch.bmm(xe, w13.transpose(1, 2))
    a = F.silu(g[..., :I]) * g[..., I:]
    y = torch.bmm(a, w2.transpose(1, 2))  # [E, T, H]
    return (y * routing.t().unsqueeze(-1).to(y.dtype)).sum(0)


def routing_for(T, device, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g).to(device)
    w, ids = llmkern.topk_softmax(logits, K, renormalize=True)
    dense = torch.zeros(T, E, device=device).scatter_(1, ids.long(), w)
    return w, ids, dense


def run(quick: bool = False, device: str = "cpu") -> list:
    bw = read_bandwidth(device) / 1e9
    g = torch.Generator().manual_seed(0)
    w13_f = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2_f = torch.randn(E, H, I, generator=g) / I ** 0.5
    decode = [1, 8, 64] if quick else [1, 4, 16, 64]
    prefill = [512] if quick else [512, 2048]
    records = []
    for dtype in (torch.float32, torch.bfloat16):
        flops_limit = compute_flops(dtype, device) / 1e9
        w13, w2 = w13_f.to(dtype).to(device), w2_f.to(dtype).to(device)
        packed = llmkern.pack_moe_weights(w13, w2) if device == "cpu" else None
        if device == "cpu":  # on huge pages, as the runtime's MoE layers keep them (the reference is there too)
            w13, w2 = move_to_hugepages([w13, w2])
            p13, p2 = move_to_hugepages([packed.w13, packed.w2])
            packed = dataclasses.replace(packed, w13=p13, w2=p2)
        variants = [("packed", packed, None)] if packed is not None else []
        if dtype != torch.float32 or packed is None:
            variants.append(("plain", w13, w2))
        for T in decode + prefill:
            is_decode = T in decode
            x = torch.randn(T, H, generator=g).to(dtype).to(device)
            tw, ids, dense = routing_for(T, device, T)
            nexp = int(ids.unique().numel())
            flops = 2 * T * K * 3 * H * I
            hf = lambda: hf_expert_loop(x, w13, w2, tw, ids)  # noqa: E731
            peers = [("HF expert loop", hf)]
            if is_decode or T <= 512:
                peers.append(("dense all-experts", lambda: dense_all_experts(x, w13, w2, dense)))
            for vname, a, b in variants:
                out = torch.empty_like(x)
                ours = lambda: llmkern.fused_moe(x, a, b, tw, ids, out=out)  # noqa: E731
                elem = a.w13.element_size() if vname == "packed" else x.element_size()
                wbytes = nexp * 3 * H * I * elem
                for pname, peer in peers:
                    if is_decode:
                        t, tp = timeit_pair(ours, peer, device)
                        rec = Record("moe/fused_moe decode", f"{str(dtype)[6:]} {vname} T={T}", t, pname, tp, "GB/s",
                                     wbytes / t / 1e9, bw,
                                     axes={"batch": T, "series": f"{str(dtype)[6:]} {vname} vs {pname}"})
                    else:
                        t, tp = timeit_pair(ours, peer, device, min_time=0.1 if quick else 0.3)
                        rec = Record("moe/fused_moe prefill", f"{str(dtype)[6:]} {vname} T={T}", t, pname, tp,
                                     "GFLOP/s", flops / t / 1e9, flops_limit,
                                     axes={"seqlen": T, "series": f"{str(dtype)[6:]} {vname} vs {pname}"})
                    records.append(rec)
    return records + (e2e_records(quick) if device == "cpu" else [])


def e2e_records(quick: bool) -> list:
    """Tiny-MoE decode tok/s, llmkern LLM vs HF generate (the model and rate helpers of
    bench_moe_parallel, the expert-parallel benchmark)."""
    try:
        import tempfile

        import transformers
        from llmkern import LLM
        from llmkern.bench import bench_moe_parallel as par
        from llmkern.models.config import ModelConfig
        from llmkern.models.loader import dummy_state_dict, save_hf_dir
    except ImportError as e:
        print(f"moe/e2e: skipped ({e})")
        return []
    n = 16 if quick else 64
    cfg = ModelConfig.from_hf(par.MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_dir(cfg, dummy_state_dict(cfg, seed=0, std=0.05), tmp)
        llm = LLM(tmp, kv_cache_memory_gb=0.25)
        hf = transformers.MixtralForCausalLM.from_pretrained(tmp).eval()
        ours = max(par.decode_rate(llm, n) for _ in range(2))
        peer = max(par.hf_decode_rate(hf, n) for _ in range(2))
        del llm, hf
    case = f"mixtral-shaped {cfg.num_layers}L h{cfg.hidden_size} {cfg.num_experts}x top-{cfg.num_experts_per_tok} b=1"
    return [Record("moe/e2e decode", case, 1 / ours, "HF generate", 1 / peer, "tok/s", ours)]


def main(argv=None) -> int:
    return bench_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
