"""The `llmkern` command.

    llmkern generate "prompt"                               stream one answer (embedded default model)
    llmkern generate --input prompts.jsonl --output out.jsonl   offline batch job + summary
    llmkern bench throughput                                end-to-end benchmark vs HF transformers

`bench` subcommands come from the BENCH_COMMANDS registry below (add an entry to plug in more)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple


# -- shared options ----------------------------------------------------------------------------
def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    g.add_argument("--load-format", default="auto", choices=["auto", "hf", "gguf", "dummy"])
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    g.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on GPU)")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-memory-gb", type=float, default=None)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--cpu-offload-gb", type=float, default=0.0)
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    g.add_argument("--scheduler", default="continuous", choices=["continuous", "static"])
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split every layer over this many processes (Megatron-style)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="split the layers into this many stages, one process group each")
    g.add_argument("--distributed-timeout-s", type=float, default=60.0,
                   help="with -tp/-pp: a collective not complete by then stops the engine with an error")
    g.add_argument("--speculative", default=None, metavar="METHOD[:K][,key=value...]",
                   help="speculative decoding, e.g. ngram:4 (prompt lookup), early_exit:3,num_layers=12, "
                        "draft:4,model=PATH (default: off)")


def _engine_kwargs(a) -> dict:
    return dict(device=a.device, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
                kv_cache_memory_gb=a.kv_cache_memory_gb, enable_prefix_caching=not a.no_prefix_caching,
                enable_chunked_prefill=not a.no_chunked_prefill, cpu_offload_gb=a.cpu_offload_gb,
                preemption_mode=a.preemption_mode, scheduler=a.scheduler,
                speculative=getattr(a, "speculative", None),
                tensor_parallel_size=a.tensor_parallel_size, pipeline_parallel_size=a.pipeline_parallel_size,
                distributed_timeout_s=a.distributed_timeout_s)


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (defaults for every prompt; JSONL lines may override)")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")


def _sampling_dict(a) -> dict:
    return dict(max_tokens=a.max_tokens, min_tokens=a.min_tokens, temperature=a.temperature, top_k=a.top_k,
                top_p=a.top_p, min_p=a.min_p, repetition_penalty=a.repetition_penalty, seed=a.seed,
                stop=a.stop, ignore_eos=a.ignore_eos)


def _make_llm(a):
    from .engine import LLM
    from .models.loader import INSTALL_HINT

    try:
        return LLM(a.model, load_format=a.load_format, **_engine_kwargs(a))
    except FileNotFoundError as e:
        msg = str(e)
        if a.model is None and INSTALL_HINT not in msg:
            msg += f" (install the default model with: {INSTALL_HINT})"
        raise SystemExit(f"llmkern: {msg}")
    except (ValueError, TypeError, NotImplementedError) as e:
        raise SystemExit(f"llmkern: {e}")
    except RuntimeError as e:
        if str(e).startswith("distributed:"):  # a rank failed to start or to load its shard
            raise SystemExit(f"llmkern: {e}")
        raise


# -- generate ----------------------------------------------------------------------------------
_PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")


def _to_prompt(obj, chat: bool, has_template: bool):
    if isinstance(obj, str):
        return [{"role": "user", "content": obj}] if chat and has_template else obj
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with a 'prompt', 'messages' or 'prompt_token_ids' field")
    keys = [k for k in _PROMPT_KEYS if k in obj]
    if len(keys) != 1:
        raise ValueError("needs exactly one of 'prompt', 'messages', 'prompt_token_ids'")
    k = keys[0]
    if k == "prompt":
        if not isinstance(obj["prompt"], str):
            raise ValueError("'prompt' must be a string")
        return _to_prompt(obj["prompt"], chat, has_template)
    return {k: obj[k]}


def _cmd_generate(a) -> int:
    if (a.prompt is None) == (a.input is None):
        raise SystemExit("llmkern generate: give either a prompt or --input FILE.jsonl")
    llm = _make_llm(a)
    from .engine import SamplingParams
    from .engine.metrics import format_summary

    base = _sampling_dict(a)
    try:
        SamplingParams(**base)
    except ValueError as e:
        raise SystemExit(f"llmkern: {e}")
    has_template = bool(llm.tokenizer and llm.tokenizer.chat_template)
    try:
        if a.prompt is not None:
            return _stream_one(llm, _to_prompt(a.prompt, not a.no_chat, has_template), SamplingParams(**base), a)
        return _run_jsonl(llm, a, base, has_template, format_summary)
    except RuntimeError as e:
        if type(e).__name__ == "DistributedError":  # a worker died or hung: say so, no traceback
            raise SystemExit(f"llmkern: {e}")
        raise
    finally:
        llm.shutdown()  # stops the worker processes of a model-parallel engine


def _stream_one(llm, prompt, sp, a) -> int:
    from .engine.metrics import format_summary

    eng = llm.engine
    try:
        rid = eng.add_request(prompt, sp, stream=True)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"llmkern: {e}")
    final = None
    while eng.has_unfinished_requests() or final is None:
        for out in eng.step():
            if out.request_id != rid:
                continue
            sys.stdout.write(out.outputs[0].delta_text)
            sys.stdout.flush()
            if out.finished:
                final = out
        if final is None and not eng.has_unfinished_requests():
            break
    sys.stdout.write("\n")
    if final is not None and not a.quiet:
        m = final.metrics
        print(f"[{final.finish_reason}] {m.num_prompt_tokens} prompt + {m.num_output_tokens} output tokens, "
              f"TTFT {1e3 * (m.ttft or 0):.1f} ms, "
              f"{m.num_output_tokens / max(m.e2e or 1e-9, 1e-9):.1f} tok/s", file=sys.stderr)
        print(format_summary(llm.run_metrics()), file=sys.stderr)
    return 0


def _run_jsonl(llm, a, base: dict, has_template: bool, format_summary) -> int:
    from .engine import SamplingParams

    eng = llm.engine
    results: Dict[int, dict] = {}
    pending: Dict[str, Tuple[int, object]] = {}
    n_bad = 0
    try:
        f = open(a.input, encoding="utf-8")
    except OSError as e:
        raise SystemExit(f"llmkern: --input: {e}")
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            ident = None
            try:
                obj = json.loads(line)
                ident = obj.get("id") if isinstance(obj, dict) else None
                prompt = _to_prompt(obj, not a.no_chat, has_template)
                overrides = {k: v for k, v in obj.items() if k not in _PROMPT_KEYS + ("id",)} \
                    if isinstance(obj, dict) else {}
                overrides.update(overrides.pop("sampling_params", {}) or {})
                sp = SamplingParams.from_dict({**base, **overrides})
                rid = eng.add_request(prompt, sp)
                pending[rid] = (lineno, ident)
            except (ValueError, TypeError, json.JSONDecodeError) as e:
                n_bad += 1
                print(f"llmkern: {a.input}:{lineno}: skipped: {e}", file=sys.stderr)
                results[lineno] = {"line": lineno, "id": ident, "error": str(e)}
    bar = None
    if not a.quiet and pending:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(pending), desc="generate", unit="req", dynamic_ncols=True, file=sys.stderr)
    out_toks, t0 = 0, time.perf_counter()
    while eng.has_unfinished_requests():
        for out in eng.step():
            if not out.finished or out.request_id not in pending:
                continue
            lineno, ident = pending.pop(out.request_id)
            m = out.metrics
            results[lineno] = {
                "line": lineno, "id": ident, "text": out.text, "token_ids": out.token_ids,
                "finish_reason": out.finish_reason,
                "outputs": [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                            for c in out.outputs] if len(out.outputs) > 1 else None,
                "metrics": {"ttft_s": m.ttft, "e2e_s": m.e2e, "prompt_tokens": m.num_prompt_tokens,
                            "output_tokens": m.num_output_tokens, "cached_prompt_tokens": m.num_cached_prompt_tokens},
            }
            if bar is not None:
                out_toks += m.num_output_tokens
                bar.set_postfix_str(f"{out_toks / (time.perf_counter() - t0):.1f} out tok/s")
                bar.update(1)
    if bar is not None:
        bar.close()
    with open(a.output, "w", encoding="utf-8") if a.output else _Stdout() as fo:
        for lineno in sorted(results):
            r = {k: v for k, v in results[lineno].items() if v is not None}
            fo.write(json.dumps(r, ensure_ascii=False) + "\n")
    if not a.quiet:
        print(format_summary(llm.run_metrics()) + (f" | {n_bad} bad line(s) skipped" if n_bad else ""),
              file=sys.stderr)
    return 1 if n_bad else 0


class _Stdout:
    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout.flush()


# -- bench -------------------------------------------------------------------------------------
def _bench_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer requests and tokens")
    p.add_argument("--num-requests", type=int, default=None, help="override the request count (e.g. 256)")
    p.add_argument("--no-peers", action="store_true", help="skip HF transformers")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None, help="also write the records to this file")


def _bench_throughput(a) -> int:
    from .engine import benchmark

    recs = benchmark.throughput(quick=a.quick, device=a.device, num_requests=a.num_requests,
                                peers=not a.no_peers)
    benchmark.print_table(recs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


# name -> (help, add_arguments(parser), run(args) -> exit code). More benchmarks plug in here,
# e.g. "kernels" (bench/bench_*.py), "e2e", "all".
BENCH_COMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "throughput": ("end-to-end offline throughput (offline-32 workload) vs HF transformers",
                   _bench_throughput_args, _bench_throughput),
}


# -- entry point --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmkern", description="llmkern: LLM inference kernels and a small runtime")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text (one prompt streamed, or a JSONL batch)")
    g.add_argument("prompt", nargs="?", default=None, help="the prompt (streamed answer)")
    g.add_argument("--input", default=None, help="JSONL file: one {\"prompt\"|\"messages\"|\"prompt_token_ids\", "
                                                 "[sampling fields], [\"id\"]} object per line")
    g.add_argument("--output", default=None, help="JSONL results (default: stdout)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template to plain prompts")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=_cmd_generate)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name, (help_, add_args, run) in BENCH_COMMANDS.items():
        p = bsub.add_parser(name, help=help_)
        add_args(p)
        p.set_defaults(func=run)
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and argv[1:2] != ["throughput"]:  # the suite: kernels | e2e | all | report
        from .bench_cli import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
