"""End-to-end runtime workloads, llmkern next to HF transformers measured in the same process.

- offline-32: SmolLM2-135M, N requests (32; 256 for the large variant), prompt lengths uniform
  32-256 (random token ids, seed 0), output lengths uniform 16-128 forced, greedy. Peers: HF
  `generate` static batching (batch 16, left-padded; a batch runs until its longest output) and
  HF continuous batching (`generate_batch`'s manager, per-request lengths) when available.
- prefix: 32 requests sharing a 1k-token system prompt, arriving one after another: TTFT with
  prefix caching vs without (same engine code, caching off).
- decode-b1: batch-1 decode, 128-token prompt, 128 new tokens, vs HF `generate`.
Used by `llmkern bench throughput` and bench/bench_e2e.py. Ratios are peer time / llmkern time."""
from __future__ import annotations

import functools
import gc
import random
import time
from typing import List, Optional

import torch

from ..models.hugepages import hugepage_fraction
from ..models.loader import default_model_path, read_gguf, save_hf_dir


def _workload(n: int, seed: int = 0, vocab: int = 49152, plo=32, phi=256, olo=16, ohi=128):
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(plo, phi))] for _ in range(n)]
    outs = [rng.randint(olo, ohi) for _ in range(n)]
    return prompts, outs


def offline_workload(n: int, quick: bool = False):
    """(prompts, output lengths) of offline-n; --quick shortens both (see throughput())."""
    prompts, outs = _workload(n)
    if quick:  # --quick must finish the whole suite in ~3 minutes on 2 cores
        prompts, outs = [p[:64] for p in prompts], [max(4, o // 8) for o in outs]
    return prompts, outs


def decode_workload(quick: bool = False):
    """(128-token prompt, new tokens) of batch-1 decode: 128 new tokens, 16 with --quick."""
    rng = random.Random(2)
    return [rng.randrange(100, 49152) for _ in range(128)], (16 if quick else 128)


@functools.lru_cache(maxsize=None)
def matmul_flops(dtype=torch.float32, n: int = 1024) -> float:
    """Measured dense fp32 matmul FLOP/s (torch.mm), the compute roofline of this machine."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def _rec(workload, case, llmkern_s, peer, peer_s, metric="", value=None, limit=None, axes=None, **extra):
    import sys

    print(f"[e2e/{workload}] {case}: llmkern {llmkern_s:.2f}s, {peer} "
          f"{'-' if peer_s is None else f'{peer_s:.2f}s'}", file=sys.stderr, flush=True)
    return {"bench": f"e2e/{workload}", "case": case, "llmkern_s": llmkern_s, "peer": peer, "peer_s": peer_s,
            "ratio": (peer_s / llmkern_s) if (peer_s and llmkern_s) else None, "metric": metric,
            "llmkern_value": value, "limit": limit, "extra": extra, "axes": dict(axes or {})}


class _HF:
    """The same SmolLM2 weights as a transformers LlamaForCausalLM (fp32), via a temp HF dir."""

    def __init__(self):
        import tempfile

        import transformers

        cfg, sd, _ = read_gguf(default_model_path())
        self.tmp = tempfile.TemporaryDirectory()
        save_hf_dir(cfg, sd, self.tmp.name)
        del sd
        self.model = transformers.LlamaForCausalLM.from_pretrained(self.tmp.name, dtype=torch.float32).eval()

    @torch.inference_mode()
    def static(self, prompts, outs, batch=16) -> float:
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch):
            ps, os_ = prompts[i:i + batch], outs[i:i + batch]
            width = max(len(p) for p in ps)
            ids = torch.zeros(len(ps), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, p in enumerate(ps):  # left padding
                ids[j, width - len(p):] = torch.tensor(p)
                mask[j, width - len(p):] = 1
            n = max(os_)
            self.model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                pad_token_id=0)
        return time.perf_counter() - t0

    @torch.inference_mode()
    def continuous(self, prompts, outs) -> Optional[float]:
        from transformers import GenerationConfig

        if not hasattr(self.model, "continuous_batching_context_manager"):
            return None
        gc_ = GenerationConfig(do_sample=False, max_new_tokens=max(outs), eos_token_id=None, pad_token_id=0)
        import logging

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        with self.model.continuous_batching_context_manager(generation_config=gc_) as mgr:
            t0 = time.perf_counter()
            for p, n in zip(prompts, outs):
                mgr.add_request(input_ids=list(p), max_new_tokens=n)
            done = 0
            while done < len(prompts):
                r = mgr.get_result(timeout=1)
                if r is not None and r.is_finished():
                    done += 1
            return time.perf_counter() - t0

    @torch.inference_mode()
    def decode_b1(self, prompt, n) -> float:
        x = torch.tensor([prompt])
        t0 = time.perf_counter()
        self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0


def _llm(**kw):
    from ..engine.llm import LLM

    kw.setdefault("quantization", None)  # the peers run the dequantised weights: so does this side
    return LLM(kv_cache_memory_gb=kw.pop("kv_cache_memory_gb", 1.0), **kw)


def _run_llmkern(llm, prompts, outs):
    from ..engine.sampling_params import SamplingParams

    sps = [SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in outs]
    t0 = time.perf_counter()
    res = llm.generate(prompts, sps, use_tqdm=False)
    dt = time.perf_counter() - t0
    assert all(len(r.token_ids) == n for r, n in zip(res, outs))
    return dt


def throughput(quick: bool = False, device: str = "cpu", num_requests: Optional[int] = None,
               peers: bool = True, workloads=("offline", "prefix", "decode")) -> List[dict]:
    recs: List[dict] = []
    hf = _HF() if peers else None
    llm = _llm(device=device)
    params = llm.engine.model_config.num_params()
    flops = matmul_flops()

    if "offline" in workloads:
        n = num_requests or (4 if quick else 32)
        prompts, outs = offline_workload(n, quick)
        # warm-up on other prompts: the timed ones must not find their prefixes cached
        _run_llmkern(llm, _workload(2, seed=99)[0], [4, 4])
        dt = _run_llmkern(llm, prompts, outs)
        toks = sum(outs)
        work = 2 * params * (sum(len(p) for p in prompts) + toks)
        frac = work / dt / flops
        offline_axes = {"requests": n, "panel": "e2e/offline", "series": ""}  # sizes share one panel
        hs = hf.static(prompts, outs) if hf else None
        recs.append(_rec(f"offline-{n}", "HF generate static batch 16", dt, "hf-generate-static", hs, "out tok/s",
                         toks / dt, axes=offline_axes, roofline_fraction=frac))
        hc = hf.continuous(prompts, outs) if hf else None
        if hf:
            recs.append(_rec(f"offline-{n}", "HF generate_batch (continuous)", dt, "hf-generate_batch", hc,
                             "out tok/s", toks / dt, axes=offline_axes, roofline_fraction=frac,
                             note=None if hc else "this transformers has no continuous batching"))
        gc.collect()

    if "prefix" in workloads:
        n = 4 if quick else 32
        rng = random.Random(1)
        system = [rng.randrange(100, 49152) for _ in range(256 if quick else 1024)]
        prompts = [system + [rng.randrange(100, 49152) for _ in range(32)] for _ in range(n)]
        ttft = {}
        for caching in (True, False):
            eng = _llm(device=device, enable_prefix_caching=caching).engine if not caching else llm.engine
            from ..engine.sampling_params import SamplingParams

            sp = SamplingParams(temperature=0, max_tokens=4, min_tokens=4)
            vals = []
            for p in prompts:  # arrivals one after another
                rid = eng.add_request(p, sp)
                while eng.has_unfinished_requests():
                    for o in eng.step():
                        if o.request_id == rid and o.finished:
                            vals.append(o.metrics.ttft)
            vals.sort()
            ttft[caching] = vals[len(vals) // 2]
        recs.append(_rec(f"prefix-{n}x{len(system)}", "TTFT p50 with vs without prefix caching", ttft[True],
                         "llmkern-no-prefix-cache", ttft[False], "ms TTFT", 1e3 * ttft[True]))

    if "decode" in workloads:
        prompt, n_new = decode_workload(quick)
        _run_llmkern(llm, [prompt], [4])
        dt = _run_llmkern(llm, [prompt], [n_new])
        hd = hf.decode_b1(prompt, n_new) if hf else None
        wbytes = llm.engine.model.weight_bytes
        hp = hugepage_fraction(llm.engine.model.lm_head.weight) if device == "cpu" else None
        recs.append(_rec("decode-b1", f"128 prompt + {n_new} new, vs HF generate", dt, "hf-generate", hd,
                         "tok/s", n_new / dt, note="llama-cpp-python peer: see bench/bench_e2e.py",
                         weight_mb_per_token=wbytes / 1e6, weight_read_gb_s=wbytes * n_new / dt / 1e9,
                         weights_on_hugepages=hp))
    return recs


def print_table(recs: List[dict]) -> None:
    hdr = f"{'benchmark':26} {'case':44} {'llmkern':>10} {'peer':>10} {'ratio':>7} {'value':>16}  peer"
    print(hdr)
    print("-" * len(hdr))
    for r in recs:
        peer = f"{r['peer_s']:9.2f}s" if r["peer_s"] else "         -"
        ratio = f"{r['ratio']:6.2f}x" if r["ratio"] else "      -"
        val = f"{r['llmkern_value']:9.2f} {r['metric']}" if r["llmkern_value"] is not None else ""
        print(f"{r['bench']:26} {r['case']:44} {r['llmkern_s']:9.2f}s {peer} {ratio} {val:>16}  {r['peer']}")
        for k, v in (r.get("extra") or {}).items():
            if v is not None:
                print(f"{'':26}   {k}: {v:.3f}" if isinstance(v, float) else f"{'':26}   {k}: {v}")
