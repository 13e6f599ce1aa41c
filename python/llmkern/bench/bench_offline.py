"""Offline batch benchmark on SmolLM2-135M (the embedded default), same engine, same process:

- offline-N shared prefixes: D documents, each asked Q questions (N = D*Q requests; documents 384-1536
  tokens, questions 16-64, forced outputs 8-96 tokens, random token ids, greedy). The engine runs it
  with schedule="throughput" and with schedule="arrival" (today's FCFS admission), the prefix cache
  reset in between; the input order is either grouped by document (how a script writing "for each
  document, for each question" lays it out) or shuffled. Ratio = arrival time / throughput time.
- embeddings: N texts of 32-512 tokens, mean pooling: LLM.embed (prefill-only, packed varlen batches,
  no padding) vs HF transformers LlamaModel on padded batches of 32 in input order (and, as a second
  peer, padded batches of texts sorted by length, which wastes less on padding).

    python bench/bench_offline.py [--num-requests 256] [--docs 16] [--embed-texts 256] [--quick]

Prints llmkern next to the peer, the ratio (> 1: llmkern faster) and the fraction of the measured fp32
matmul roofline (2 x params FLOPs per token)."""
from __future__ import annotations

SUITE = "standalone"  # several processes / long workloads: run by its own command only

import argparse
import gc
import os
import random
import sys
import time

import torch

from llmkern.bench.common import Record, print_records  # noqa: E402

from llmkern import LLM, SamplingParams  # noqa: E402
from llmkern.bench.throughput import _HF, matmul_flops  # noqa: E402

VOCAB = 49152


def shared_prefix_workload(n: int, docs: int, seed: int = 0, quick: bool = False):
    rng = random.Random(seed)
    q = max(1, n // docs)
    dlo, dhi = (96, 256) if quick else (384, 1536)
    documents = [[rng.randrange(100, VOCAB) for _ in range(rng.randint(dlo, dhi))] for _ in range(docs)]
    reqs = []
    for d in documents:
        for _ in range(q):
            question = [rng.randrange(100, VOCAB) for _ in range(rng.randint(16, 64))]
            reqs.append((d + question, rng.randint(4, 24) if quick else rng.randint(8, 96)))
    return reqs


def run_generate(llm, reqs, schedule: str) -> float:
    llm.reset_prefix_cache()
    llm.engine.config.schedule = schedule
    sps = [SamplingParams(temperature=0, max_tokens=m, min_tokens=m, ignore_eos=True) for _, m in reqs]
    computed0 = llm.engine.metrics.prompt_tokens_computed
    c0, t0 = time.process_time(), time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], sps, use_tqdm=False)
    dt = time.perf_counter() - t0
    run_generate.cpu = time.process_time() - c0
    assert all(len(o.token_ids) == m for o, (_, m) in zip(outs, reqs))
    run_generate.computed = llm.engine.metrics.prompt_tokens_computed - computed0
    run_generate.tokens = [o.token_ids for o in outs]
    return dt


def bench_schedule(llm, n, docs, quick, params, flops):
    recs = []
    reqs = shared_prefix_workload(n, docs, quick=quick)
    run_generate(llm, reqs[:2], "arrival")  # warm-up
    prompt_toks = sum(len(p) for p, _ in reqs)
    out_toks = sum(m for _, m in reqs)
    for order in ("grouped", "shuffled"):
        rs = list(reqs)
        if order == "shuffled":
            random.Random(1).shuffle(rs)
        t_thr = run_generate(llm, rs, "throughput")
        c_thr, tok_thr, cpu_thr = run_generate.computed, run_generate.tokens, run_generate.cpu
        t_arr = run_generate(llm, rs, "arrival")
        c_arr, tok_arr, cpu_arr = run_generate.computed, run_generate.tokens, run_generate.cpu
        same = tok_thr == tok_arr
        print(f"[offline-{len(rs)} {order}] throughput {t_thr:.2f}s wall {cpu_thr:.2f}s CPU ({c_thr} prompt tokens "
              f"computed), arrival {t_arr:.2f}s wall {cpu_arr:.2f}s CPU ({c_arr} computed), same tokens: {same}",
              file=sys.stderr, flush=True)
        # On a shared machine the CPU time of this process is the steadier measure of the work done.
        recs.append(Record("offline/schedule (CPU s)", f"offline-{len(rs)} {docs} docs, {order} input", cpu_thr,
                           "same engine, arrival order", cpu_arr, "s"))
        work = 2 * params * (c_thr + out_toks)
        recs.append(Record("offline/schedule", f"offline-{len(rs)} {docs} docs, {order} input", t_thr,
                           "same engine, arrival order", t_arr, "tok/s", (prompt_toks + out_toks) / t_thr,
                           extra=dict(roofline_fraction=work / t_thr / flops, prompt_tokens=prompt_toks,
                                      output_tokens=out_toks, computed_throughput=c_thr, computed_arrival=c_arr,
                                      same_tokens=same),
                           axes={"requests": len(rs), "series": f"{docs} docs, {order} input"}))
    return recs


@torch.inference_mode()
def hf_embed(model, texts, batch=32, sort=False):
    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if sort else list(range(len(texts)))
    out = [None] * len(texts)
    t0 = time.perf_counter()
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        width = max(len(texts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(idx):  # right padding, masked out of attention and of the mean
            ids[j, :len(texts[i])] = torch.tensor(texts[i])
            mask[j, :len(texts[i])] = 1
        h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)
        for j, i in enumerate(idx):
            out[i] = e[j]
    return time.perf_counter() - t0, torch.stack(out)


def bench_embed(llm, hf, n, quick, params, flops):
    rng = random.Random(3)
    hi = 128 if quick else 512
    texts = [[rng.randrange(100, VOCAB) for _ in range(rng.randint(32, hi))] for _ in range(n)]
    toks = sum(map(len, texts))
    prompts = [{"prompt_token_ids": t} for t in texts]
    llm.embed(prompts[:4])  # warm-up
    hf_embed(hf.model, texts[:4])
    c0, t0 = time.process_time(), time.perf_counter()
    ours = llm.embed(prompts, pooling="mean")
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    c0 = time.process_time()
    t_pad, ref = hf_embed(hf.model, texts)
    cpu_pad = time.process_time() - c0
    t_sort, _ = hf_embed(hf.model, texts, sort=True)
    err = (torch.tensor([o.outputs.embedding for o in ours]) - ref).abs().max().item()
    print(f"[embed-{n}] llmkern {dt:.2f}s, HF padded {t_pad:.2f}s, HF sorted {t_sort:.2f}s, max |diff| {err:.2e}",
          file=sys.stderr, flush=True)
    extra = dict(roofline_fraction=2 * params * toks / dt / flops, tokens=toks, max_abs_diff=err)
    return [Record("offline/embed (CPU s)", f"{n} texts 32-{hi} tok, mean", cpu, "HF LlamaModel padded batch 32",
                   cpu_pad, "s"),
            Record("offline/embed", f"{n} texts 32-{hi} tok, mean", dt, "HF LlamaModel padded batch 32", t_pad,
                   "tok/s", toks / dt, extra=extra),
            Record("offline/embed", f"{n} texts 32-{hi} tok, mean", dt, "HF padded batch 32, length-sorted",
                   t_sort, "tok/s", toks / dt, extra=extra)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--embed-texts", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="short documents and outputs")
    ap.add_argument("--skip", choices=["schedule", "embed"], action="append", default=[])
    a = ap.parse_args(argv)
    llm = LLM(kv_cache_memory_gb=2.0)
    params = llm.engine.model_config.num_params()
    flops = matmul_flops()
    recs = []
    if "schedule" not in a.skip:
        recs += bench_schedule(llm, a.num_requests, a.docs, a.quick, params, flops)
        gc.collect()
    if "embed" not in a.skip:
        hf = _HF()
        recs += bench_embed(llm, hf, a.embed_texts, a.quick, params, flops)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; matmul roofline {flops / 1e9:.0f} GFLOP/s")
    print_records(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
