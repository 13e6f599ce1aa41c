"""Batch-1 decode with the one-call C++ decode step against the Python layer loop, side by side.

SmolLM2-135M (the embedded model), a 128-token prompt then `--new` greedy tokens, per dtype. One
engine per dtype serves both modes (same weights, same caches): the model's step is switched off
and on between runs, alternating for `--rounds` rounds, and each mode's best time per token is
kept. Reported: tok/s of each, their ratio, each mode's fraction of the weight-bandwidth bound
(weight bytes per token / a read bandwidth measured in the same run, as bench_decode_profile), the
load average (a shared machine makes single figures noisy; the ratio of alternating runs less so)
and whether both modes produced the same tokens.

    python -m llmkern.bench.bench_decode_step [--quick] [--dtype bfloat16] [--threads 1] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys

SUITE = "e2e"


def run(quick: bool = False, device: str = "cpu", dtypes=("float32", "bfloat16"), threads: int = 0,
        new_tokens: int = 0, rounds: int = 0) -> list:
    import llmkern
    from llmkern.bench.bench_decode_profile import _bandwidth, batch1_setup
    from llmkern.bench.common import Record
    from llmkern.engine.llm import LLM
    from llmkern.engine.sampling_params import SamplingParams

    cpu_time, clock, n_new, prompt = batch1_setup("bench_decode_step", device, threads, quick, new_tokens)
    rounds = rounds or (2 if quick else 5)
    recs = []
    for dt in dtypes:
        llm = LLM(dtype=dt, kv_cache_memory_gb=0.25, quantization=None)
        eng = llm.engine
        model = eng.model
        step = model.decode_step()
        if step is None:
            raise SystemExit(f"bench_decode_step: no one-call step for this model in {dt} (LLMKERN_DECODE_STEP=0?)")
        sp = SamplingParams(temperature=0, max_tokens=n_new, min_tokens=n_new, ignore_eos=True)

        def decode(on: bool):
            model._decode_step = step if on else None
            rid = eng.add_request(prompt, sp)
            eng.step()  # the prefill and the first token
            steps, t0 = 0, clock()
            done = []
            while eng.has_unfinished_requests():
                done += eng.step()
                steps += 1
            dt_tok = (clock() - t0) / steps
            toks = [o.outputs[0].token_ids for o in done if o.request_id == rid and o.finished]
            return dt_tok, toks[0] if toks else None

        decode(True), decode(False)  # warm-up
        best = {True: float("inf"), False: float("inf")}
        tokens = {}
        for _ in range(rounds):
            for on in (True, False):
                t, toks = decode(on)
                best[on] = min(best[on], t)
                tokens[on] = toks
        model._decode_step = step
        bw = _bandwidth(cpu_time)
        bound = model.weight_bytes / bw
        load = os.getloadavg()
        same = tokens[True] is not None and tokens[True] == tokens[False]
        recs.append(Record("e2e/decode-b1 one-call step", f"{dt} 128+{n_new}, {llmkern.get_num_threads()} thread(s)"
                           + (" (CPU time)" if cpu_time else ""), best[True], "Python layer loop", best[False],
                           "tok/s", 1 / best[True], 1 / bound,
                           extra={"loop_tok_s": round(1 / best[False], 1),
                                  "loop_fraction_of_bound": round(bound / best[False], 3),
                                  "weight_mb": round(model.weight_bytes / 1e6, 1), "read_gb_s": round(bw / 1e9, 1),
                                  "load_avg_1m": round(load[0], 2), "same_tokens": same}))
        print(f"[decode-step] {dt}: one call {1e3 * best[True]:.2f} ms/token ({bound / best[True]:.2f} of the bound), "
              f"Python loop {1e3 * best[False]:.2f} ms/token ({bound / best[False]:.2f}), "
              f"ratio {best[False] / best[True]:.2f}x; bound {1e3 * bound:.2f} ms at {bw / 1e9:.1f} GB/s; "
              f"load average {load[0]:.2f}; same tokens: {same}", file=sys.stderr)
        del llm, eng, model, step
    return recs


def main(argv=None) -> int:
    from llmkern.bench.common import print_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", action="append", choices=["float32", "bfloat16"], help="repeatable; default both")
    ap.add_argument("--threads", type=int, default=0, help="0 = llmkern's default")
    ap.add_argument("--new", type=int, default=0, help="tokens to decode (default 128, 16 with --quick)")
    ap.add_argument("--rounds", type=int, default=0, help="alternating rounds (default 5, 2 with --quick)")
    args = ap.parse_args(argv)
    print_records(run(args.quick, dtypes=tuple(args.dtype or ("float32", "bfloat16")), threads=args.threads,
                      new_tokens=args.new, rounds=args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
