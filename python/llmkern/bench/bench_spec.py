"""Speculative decoding in the runtime: n-gram (prompt lookup) speculation vs plain decoding on
SmolLM2-135M (fp32), same engine and weights, same process, runs alternated so that machine
load affects both sides alike.

    python bench/bench_spec.py [--quick] [--k 4]

Workloads:
  - batch 1, copying: "repeat this text with small edits" and "rename an identifier in this
    code" prompts, greedy; decode tokens/s (first token to last) with and without speculation,
    acceptance rate, mean accepted length, and whether the greedy outputs are identical;
  - batch 16, mixed: copying and open-ended prompts together; speculation forced on, and with the
    default batch-size cut-off (speculation off while more than 16 sequences decode).
The ratio column is plain time / speculative time (> 1: speculation is faster).

Run as a script, this sets OMP_WAIT_POLICY=PASSIVE (unless already set) before torch loads: on a
CPU shared with other jobs, OpenMP threads spinning at barriers stall every multi-row matmul
(prompt prefill and speculative verification alike) by whole scheduler time slices, while the
one-row decode matmul is barely affected -- a measurement of the machine's load, not of the
method. Both sides always run under the same setting."""
from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from llmkern.bench.common import Record, print_records  # noqa: E402

SUITE = "e2e"

TEXT = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips. Every "
        "evening the keeper climbed the hundred and twelve steps to light the lamp, and every morning he "
        "climbed them again to put it out. Ships passing in the night saw the beam sweep across the water "
        "and knew they were close to the harbour. The keeper kept a logbook of every ship he saw, writing "
        "down its name, its flag and the time it passed.")
CODE = '''def update_inventory(inventory, item_name, quantity):
    if item_name in inventory:
        inventory[item_name] = inventory[item_name] + quantity
    else:
        inventory[item_name] = quantity
    if inventory[item_name] <= 0:
        del inventory[item_name]
    return inventory


def total_items(inventory):
    total = 0
    for item_name in inventory:
        total = total + inventory[item_name]
    return total
'''
COPY_PROMPTS = [
    [{"role": "user", "content": "Repeat this text exactly, but write 'lighthouse' as 'tower':\n\n" + TEXT}],
    [{"role": "user", "content": "Rewrite this code with the variable item_name renamed to name. Output only "
                                 "the code.\n\n" + CODE}],
]
OPEN_PROMPTS = [
    "Write a short story about a cat who learns to fly.",
    "Explain how a refrigerator works.",
    "List five ideas for a birthday party.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle in simple words.",
    "Give three tips for learning a new language.",
]


def _generate(llm, prompts, sp):
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    toks = [o.token_ids for o in outs]
    # Decode phase of each request: first token to finish (the prompt's prefill is the same work
    # with and without speculation).
    dec = [(len(o.token_ids) - 1, o.metrics.finish_time - o.metrics.first_token_time) for o in outs]
    return toks, wall, dec


def _spec_stats(llm, before: dict) -> dict:
    m = llm.run_metrics()["speculative"]
    d = {k: m[k] - before.get(k, 0) for k in ("draft_tokens", "accepted_tokens", "verified",
                                               "draft_time_s", "verify_time_s")}
    d["acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else 0.0
    d["mean_accepted_length"] = (d["accepted_tokens"] + d["verified"]) / d["verified"] if d["verified"] else 0.0
    return d


def _pair(llm, prompts, sp, reps: int, disable_by_batch_size):
    """Alternate plain / speculative runs; returns medians and the speculative statistics."""
    eng = llm.engine
    spec = eng.spec
    spec.cfg.disable_by_batch_size = disable_by_batch_size
    plain_t, spec_t, same = [], [], True
    before = dict(llm.run_metrics()["speculative"])
    n_tok = 0
    for _ in range(reps):
        eng.spec = None
        ref, wall_p, dec_p = _generate(llm, prompts, sp)
        eng.spec = spec
        got, wall_s, dec_s = _generate(llm, prompts, sp)
        same &= ref == got
        if len(prompts) == 1:   # batch 1: decode phase only
            plain_t.append(dec_p[0][1])
            spec_t.append(dec_s[0][1])
            n_tok = dec_p[0][0]
        else:                   # a batch: wall time of the whole job
            plain_t.append(wall_p)
            spec_t.append(wall_s)
            n_tok = sum(len(t) for t in ref)
    plain_t.sort()
    spec_t.sort()
    return plain_t[len(plain_t) // 2], spec_t[len(spec_t) // 2], n_tok, same, _spec_stats(llm, before)


def run(quick: bool = False, device: str = "cpu", k: int = 4) -> list:
    from llmkern import LLM, SamplingParams
    from llmkern.models.loader import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as e:
        print(f"bench_spec: skipped ({e})")
        return []
    llm = LLM(device=device, speculative=dict(method="ngram", num_speculative_tokens=k, prompt_lookup_min=2,
                                              prompt_lookup_max=4))
    policy = os.environ.get("OMP_WAIT_POLICY", "default (spinning)")
    print(f"bench_spec: OMP_WAIT_POLICY={policy}, {__import__('torch').get_num_threads()} threads")
    reps = 1 if quick else 3
    recs = []
    sp1 = SamplingParams(temperature=0, max_tokens=48 if quick else 128)
    for name, prompt in zip(("copy-edit text", "rename in code"), COPY_PROMPTS):
        if quick and name != "copy-edit text":
            continue
        tp, ts, n, same, st = _pair(llm, [prompt], sp1, reps, None)
        recs.append(Record(
            "spec/ngram batch-1", f"{name}, k={k}", ts, "plain decoding (same engine)", tp, "tok/s", n / ts,
            axes={"batch": 1}, extra={"identical_greedy_output": same, "acceptance_rate": round(st["acceptance_rate"], 3),
                   "mean_accepted_length": round(st["mean_accepted_length"], 2), "tokens": n,
                   "draft_s": round(st["draft_time_s"], 3), "verify_s": round(st["verify_time_s"], 3),
                   "omp_wait_policy": policy,
                   "headline": name == "copy-edit text"}))
        print_records(recs[-1:])
    if not quick:
        prompts = (COPY_PROMPTS * 5)[:10] + OPEN_PROMPTS
        sp16 = SamplingParams(temperature=0, max_tokens=64)
        for label, cap, ps in (("forced on", None, prompts), ("default cut-off 16", 16, prompts)):
            tp, ts, n, same, st = _pair(llm, ps, sp16, 1, cap)
            recs.append(Record(
                "spec/ngram batch-16", f"mixed 10 copy + 6 open, {label}", ts, "plain decoding (same engine)", tp,
                "tok/s", n / ts,
                axes={"batch": 16}, extra={"identical_greedy_output": same, "acceptance_rate": round(st["acceptance_rate"], 3),
                       "mean_accepted_length": round(st["mean_accepted_length"], 2), "tokens": n}))
            print_records(recs[-1:])
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=4, help="drafts per step")
    a = ap.parse_args(argv)
    rs = run(quick=a.quick, device=a.device, k=a.k)
    print()
    print_records(rs)
    for r in rs:
        print(f"{r.bench} | {r.case}: {r.ratio:.2f}x, acceptance {100 * r.extra['acceptance_rate']:.1f}%, "
              f"mean accepted length {r.extra['mean_accepted_length']:.2f}, identical greedy output: "
              f"{r.extra['identical_greedy_output']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
