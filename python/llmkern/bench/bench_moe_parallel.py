"""Expert parallelism on one CPU machine: a Mixtral-shaped MoE with random weights (fp32), EP=2
(two ranks, one thread each) against the single-process engine (two threads) and HF transformers'
`generate` (two threads), all in the same run, measurements alternated between the engines so the
load from other jobs on the machine affects them alike.

    python -m llmkern.bench.bench_moe_parallel [--quick] [--rounds 2]

Workloads: batch-1 decode (decode tokens/s from first to last token) and offline-16 (16 prompts
at once; output tokens/s). For EP=2 also the all-to-all volume per engine step, three ways:
  - computed: from every rank's routing (the (token, remote rank) pairs times the packed row and
    the result row; distributed/expert_parallel.py: EPStats);
  - measured: the dispatch + combine payload counted at the all_to_all_single calls;
  - expected: the same count under uniform routing (expert_parallel.expected_a2a_bytes) for the
    tokens the steps carried;
and the time each rank spent in the collectives per step (gloo runs them synchronously)."""
from __future__ import annotations

SUITE = "standalone"  # several processes: run by its own command only

import argparse
import os
import tempfile
import time

if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import llmkern  # noqa: E402
from llmkern import LLM, SamplingParams  # noqa: E402

MODEL = dict(model_type="mixtral", vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
             max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
PROMPT = list(range(10, 74))  # 64 prompt tokens


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    llmkern.set_num_threads(n)


def decode_rate(llm, n: int) -> float:
    m = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)[0].metrics
    return (m.num_output_tokens - 1) / (m.e2e - m.ttft)


def offline_rate(llm, n_req: int, n: int) -> float:
    prompts = [PROMPT[i:] + [i + 100] for i in range(n_req)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


@torch.inference_mode()
def hf_decode_rate(model, n: int) -> float:
    ids = torch.tensor([PROMPT])
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    t1 = time.perf_counter()
    model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
    return (n - 1) / (time.perf_counter() - t1 - (t1 - t0))


def a2a_per_step(stats, cfg) -> dict:
    from llmkern.distributed.expert_parallel import expected_a2a_bytes

    steps = stats[0]["steps"]
    sparse = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    measured = sum(s["comm"]["bytes"].get("a2a_dispatch", 0) + s["comm"]["bytes"].get("a2a_combine", 0) for s in stats)
    computed = sum(s["moe"]["a2a_bytes_computed"] for s in stats)
    tokens = sum(s["moe"]["tokens_routed"] for s in stats) // max(1, sparse)  # rows the steps carried
    expected = sparse * expected_a2a_bytes(tokens, cfg.hidden_size, 4, cfg.num_experts_per_tok, cfg.num_experts, 2)
    coll_s = [s["comm"]["total_seconds"] / max(1, steps) for s in stats]
    return {"steps": steps, "tokens_per_step": tokens / max(1, steps), "computed": computed / max(1, steps),
            "measured": measured / max(1, steps), "expected_uniform": expected / max(1, steps),
            "collective_ms_per_step": [1e3 * t for t in coll_s]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer tokens")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    n_dec, n_off = (16, 8) if a.quick else (64, 32)
    import transformers

    from llmkern.models.config import ModelConfig
    from llmkern.models.loader import dummy_state_dict, save_hf_dir

    cfg = ModelConfig.from_hf(MODEL)
    tmp = tempfile.TemporaryDirectory()
    save_hf_dir(cfg, dummy_state_dict(cfg, seed=0, std=0.05), tmp.name)
    set_threads(2)
    one = LLM(tmp.name, kv_cache_memory_gb=0.25)
    ep = LLM(tmp.name, expert_parallel_size=2, kv_cache_memory_gb=0.25)
    set_threads(2)  # the EP engine's rank 0 took one thread; the others get the machine's two
    hf = transformers.MixtralForCausalLM.from_pretrained(tmp.name).eval()
    try:
        rates = {k: [] for k in ("single dec", "ep2 dec", "hf dec", "single off", "ep2 off")}
        for _ in range(a.rounds):
            set_threads(2)
            rates["single dec"].append(decode_rate(one, n_dec))
            rates["hf dec"].append(hf_decode_rate(hf, n_dec))
            rates["single off"].append(offline_rate(one, 16, n_off))
            set_threads(1)
            ep.engine.executor.stats(reset=True)
            rates["ep2 dec"].append(decode_rate(ep, n_dec))
            dec_a2a = a2a_per_step(ep.engine.executor.stats(reset=True), cfg)
            rates["ep2 off"].append(offline_rate(ep, 16, n_off))
            off_a2a = a2a_per_step(ep.engine.executor.stats(reset=True), cfg)
        best = {k: max(v) for k, v in rates.items()}
        print(f"model: Mixtral-shaped, {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_experts} experts "
              f"top-{cfg.num_experts_per_tok}, expert intermediate {cfg.moe_intermediate_size}, fp32, 2 cores in all")
        print(f"{'workload':<14}{'single (2 thr)':>16}{'EP=2 (1 thr/rank)':>20}{'EP/single':>11}{'HF generate':>13}"
              f"{'single/HF':>11}")
        print(f"{'decode b=1':<14}{best['single dec']:>16.1f}{best['ep2 dec']:>20.1f}"
              f"{best['ep2 dec'] / best['single dec']:>11.2f}{best['hf dec']:>13.1f}"
              f"{best['single dec'] / best['hf dec']:>11.2f}")
        print(f"{'offline-16':<14}{best['single off']:>16.1f}{best['ep2 off']:>20.1f}"
              f"{best['ep2 off'] / best['single off']:>11.2f}")
        for name, r in (("decode b=1", dec_a2a), ("offline-16", off_a2a)):
            print(f"all-to-all per step, {name} (last round, {r['steps']} steps, {r['tokens_per_step']:.1f} tokens/step): "
                  f"computed {r['computed']:.0f} B, measured {r['measured']:.0f} B, uniform-routing expectation "
                  f"{r['expected_uniform']:.0f} B; time in collectives per step "
                  f"{', '.join(f'{t:.2f}' for t in r['collective_ms_per_step'])} ms (rank 0, 1)")
    finally:
        ep.shutdown()
        tmp.cleanup()


if __name__ == "__main__":
    main()
