"""The `llmkern` command.

    llmkern generate "prompt"                               stream one answer (embedded default model)
    llmkern generate --input prompts.jsonl --output out.jsonl   offline batch job + summary
    llmkern bench throughput                                end-to-end benchmark vs HF transformers

`bench` subcommands come from the BENCH_COMMANDS registry below (add an entry to plug in more)."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple


# -- shared options ----------------------------------------------------------------------------
class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default (except None / False, which mean "off" or "automatic")."""

    def _get_help_string(self, action):
        h = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings and "%(default)" not in h:
            h += " (default: %(default)s)"
        return h


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    g.add_argument("--load-format", default="auto", choices=["auto", "hf", "gguf", "dummy"],
                   help="how to read --model (dummy: random weights from its config)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    g.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on GPU)")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV cache size in GiB (default: 2 on CPU, free memory x 0.85 on GPU)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    g.add_argument("--no-chunked-prefill", action="store_true", help="run each prompt's prefill in one step")
    g.add_argument("--cpu-offload-gb", type=float, default=0.0, help="host tier for evicted prefix blocks, GiB")
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"],
                   help="what preemption does with a sequence's KV blocks")
    g.add_argument("--scheduler", default="continuous", choices=["continuous", "static"],
                   help="continuous batching, or static batches for comparison")
    g.add_argument("--speculative", default=None, metavar="METHOD[:K][,key=value...]",
                   help="speculative decoding, e.g. ngram:4 (prompt lookup), early_exit:3,num_layers=12, "
                        "draft:4,model=PATH (default: off)")


def _engine_kwargs(a) -> dict:
    return dict(device=a.device, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
                kv_cache_memory_gb=a.kv_cache_memory_gb, enable_prefix_caching=not a.no_prefix_caching,
                enable_chunked_prefill=not a.no_chunked_prefill, cpu_offload_gb=a.cpu_offload_gb,
                preemption_mode=a.preemption_mode, scheduler=a.scheduler,
                speculative=getattr(a, "speculative", None))


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (defaults for every prompt; JSONL lines may override)")
    g.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate per prompt")
    g.add_argument("--min-tokens", type=int, default=0, help="EOS and stop tokens are masked until this many")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    g.add_argument("--seed", type=int, default=None, help="per-request seed (default: the engine's generator)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")


def _sampling_dict(a) -> dict:
    return dict(max_tokens=a.max_tokens, min_tokens=a.min_tokens, temperature=a.temperature, top_k=a.top_k,
                top_p=a.top_p, min_p=a.min_p, repetition_penalty=a.repetition_penalty, seed=a.seed,
                stop=a.stop, ignore_eos=a.ignore_eos)


def _as_option(msg: str) -> str:
    """'max_tokens: expected ...' -> '--max-tokens: expected ...' (errors name the flag the user typed)."""
    field, sep, rest = msg.partition(":")
    if sep and field.isidentifier():
        return f"--{field.replace('_', '-')}:{rest}"
    return msg


def _fail(msg: str) -> SystemExit:
    return SystemExit("llmkern: " + " ".join(msg.split()))  # one line, whatever the message held


def _check_engine_args(a) -> None:
    """Everything about the engine that can be checked without loading the model."""
    from .engine import EngineConfig

    try:
        EngineConfig(**_engine_kwargs(a))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise _fail(_as_option(str(e)))
    if a.model is not None and not os.path.exists(a.model) and a.load_format != "dummy":
        raise _fail(f"--model: {a.model!r} does not exist (expected a HF model directory or a .gguf file)")


def _make_llm(a):
    from .engine import LLM
    from .models.loader import INSTALL_HINT

    try:
        return LLM(a.model, load_format=a.load_format, **_engine_kwargs(a))
    except FileNotFoundError as e:
        msg = str(e)
        if a.model is None and INSTALL_HINT not in msg:
            msg += f" (install the default model with: {INSTALL_HINT})"
        raise _fail(msg)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise _fail(_as_option(str(e)))
    except (OSError, RuntimeError, MemoryError) as e:  # e.g. a file that vanished, out of memory
        raise _fail(f"could not load the model: {type(e).__name__}: {e}")


# -- generate ----------------------------------------------------------------------------------
def _cmd_generate(a) -> int:
    if (a.prompt is None) == (a.input is None):
        raise SystemExit("llmkern generate: give either a prompt or --input FILE.jsonl")
    from .engine import SamplingParams

    base = _sampling_dict(a)
    try:
        SamplingParams(**base)
    except ValueError as e:
        raise _fail(_as_option(str(e)))
    _check_engine_args(a)
    fin = None
    if a.input is not None:
        try:
            fin = open(a.input, "rb")
        except OSError as e:
            raise _fail(f"--input: cannot read {a.input!r}: {e.strerror or e}")
    if a.output is not None:
        _check_writable(a.output)
    try:
        llm = _make_llm(a)
        has_template = bool(llm.tokenizer and llm.tokenizer.chat_template)
        if a.prompt is not None:
            from .jsonl_job import to_prompt

            return _stream_one(llm, to_prompt(a.prompt, not a.no_chat, has_template), SamplingParams(**base), a)
        return _run_jsonl(llm, a, fin, base, has_template)
    finally:
        if fin is not None:
            fin.close()


def _check_writable(path: str) -> None:
    """--output must be writable before any work is done; probed without truncating it."""
    if os.path.isdir(path):
        raise _fail(f"--output: {path!r} is a directory")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise _fail(f"--output: cannot write {path!r}: {e.strerror or e}")


def _stream_one(llm, prompt, sp, a) -> int:
    from .engine.metrics import format_summary

    eng = llm.engine
    try:
        rid = eng.add_request(prompt, sp, stream=True)
    except (ValueError, TypeError) as e:
        raise _fail(str(e))
    final = None
    try:
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
    except Exception as e:  # what was streamed stays on screen; the failure is one line
        sys.stdout.write("\n")
        raise _fail(f"generation failed: {type(e).__name__}: {e}")
    sys.stdout.write("\n")
    if final is not None and not a.quiet:
        m = final.metrics
        print(f"[{final.finish_reason}] {m.num_prompt_tokens} prompt + {m.num_output_tokens} output tokens, "
              f"TTFT {1e3 * (m.ttft or 0):.1f} ms, "
              f"{m.num_output_tokens / max(m.e2e or 1e-9, 1e-9):.1f} tok/s", file=sys.stderr)
        print(format_summary(llm.run_metrics()), file=sys.stderr)
    return 0


def _run_jsonl(llm, a, fin, base: dict, has_template: bool) -> int:
    from .engine import SamplingParams
    from .engine.metrics import format_summary
    from .jsonl_job import ResultWriter, overrides, read_lines, to_prompt

    eng = llm.engine
    pending: Dict[str, Tuple[int, object]] = {}
    n_bad = 0
    try:
        fo = open(a.output, "w", encoding="utf-8") if a.output else None
    except OSError as e:
        raise _fail(f"--output: cannot write {a.output!r}: {e.strerror or e}")
    out = ResultWriter(fo or sys.stdout)

    def bad(lineno, ident, msg):
        nonlocal n_bad
        n_bad += 1
        print(f"llmkern: {a.input}:{lineno}: skipped: {msg}", file=sys.stderr)
        out.error(lineno, ident, msg)

    try:
        for lineno, obj, err in read_lines(fin):
            if err is not None:
                bad(lineno, None, err)
                continue
            ident = obj.get("id") if isinstance(obj, dict) else None
            try:
                prompt = to_prompt(obj, not a.no_chat, has_template)
                sp = SamplingParams.from_dict({**base, **overrides(obj)})
                pending[eng.add_request(prompt, sp)] = (lineno, ident)
            except Exception as e:  # a bad line is that line's problem alone
                bad(lineno, ident, str(e) or type(e).__name__)
        bar = None
        if not a.quiet and pending:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(pending), desc="generate", unit="req", dynamic_ncols=True, file=sys.stderr)
        out_toks, t0 = 0, time.perf_counter()
        try:
            while eng.has_unfinished_requests():
                for res in eng.step():
                    if not res.finished or res.request_id not in pending:
                        continue
                    lineno, ident = pending.pop(res.request_id)
                    out.result(lineno, ident, res)
                    if bar is not None:
                        out_toks += res.metrics.num_output_tokens
                        bar.set_postfix_str(f"{out_toks / (time.perf_counter() - t0):.1f} out tok/s")
                        bar.update(1)
        except Exception as e:  # keep what finished; every unfinished line gets the error
            msg = f"generation failed: {type(e).__name__}: {e}"
            print(f"llmkern: {msg}", file=sys.stderr)
            for rid, (lineno, ident) in sorted(pending.items(), key=lambda kv: kv[1][0]):
                eng.abort(rid)
                out.error(lineno, ident, msg)
                n_bad += 1
            pending.clear()
        finally:
            if bar is not None:
                bar.close()
    finally:
        if fo is not None:
            fo.close()
        else:
            sys.stdout.flush()
    if not a.quiet:
        print(format_summary(llm.run_metrics()) + (f" | {n_bad} bad line(s) skipped" if n_bad else ""),
              file=sys.stderr)
    return 1 if n_bad else 0


# -- bench -------------------------------------------------------------------------------------
def _bench_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer requests and tokens")
    p.add_argument("--num-requests", type=int, default=None, help="override the request count (e.g. 256)")
    p.add_argument("--no-peers", action="store_true", help="skip HF transformers")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", default=None, help="also write the records to this file")


def _bench_throughput(a) -> int:
    import importlib.util

    from .engine import benchmark

    if not a.no_peers and importlib.util.find_spec("transformers") is None:
        raise _fail("bench throughput: the HF transformers peer needs transformers "
                    "(pip install \"llmkern[bench]\"), or pass --no-peers")
    try:
        _check_device(a.device)
    except ValueError as e:
        raise _fail(f"--{e}")
    recs = benchmark.throughput(quick=a.quick, device=a.device, num_requests=a.num_requests,
                                peers=not a.no_peers)
    benchmark.print_table(recs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


def _check_device(device: str) -> None:
    from .engine import EngineConfig

    EngineConfig(device=device)


# name -> (help, add_arguments(parser), run(args) -> exit code). More benchmarks plug in here,
# e.g. "kernels" (bench/bench_*.py), "e2e", "all".
BENCH_COMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "throughput": ("end-to-end offline throughput (offline-32 workload) vs HF transformers",
                   _bench_throughput_args, _bench_throughput),
}


# -- entry point --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llmkern", description="llmkern: LLM inference kernels and a small runtime")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{generate,bench}")

    g = sub.add_parser("generate", help="generate text (one prompt streamed, or a JSONL batch)",
                       formatter_class=_HelpFormatter)
    g.add_argument("prompt", nargs="?", default=None, help="the prompt (streamed answer)")
    g.add_argument("--input", default=None, help="JSONL file: one {\"prompt\"|\"messages\"|\"prompt_token_ids\", "
                                                 "[sampling fields], [\"id\"]} object per line")
    g.add_argument("--output", default=None, help="JSONL results, written as they finish (default: stdout)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template to plain prompts")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=_cmd_generate)

    b = sub.add_parser("bench", help="benchmarks: throughput (end-to-end vs HF), kernels, e2e, all, report "
                                     "(llmkern bench SUBCOMMAND --help)")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name, (help_, add_args, run) in BENCH_COMMANDS.items():
        p = bsub.add_parser(name, help=help_, formatter_class=_HelpFormatter)
        add_args(p)
        p.set_defaults(func=run)
    return ap


def _subparser(ap: argparse.ArgumentParser, names: List[str]) -> argparse.ArgumentParser:
    """The (sub)parser reached by following `names` (e.g. ["bench", "throughput"])."""
    p = ap
    for n in names:
        acts = [x for x in p._actions if isinstance(x, argparse._SubParsersAction)]
        if not acts or n not in acts[0].choices:
            break
        p = acts[0].choices[n]
    return p


def _unknown_option_error(p: argparse.ArgumentParser, extra: List[str]) -> None:
    """Report the first unknown argument on the subcommand's own parser, with a suggestion."""
    known = [o for act in p._actions for o in act.option_strings]
    first = extra[0]
    if first.startswith("-"):
        name = first.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        p.error(f"unrecognized option {name}" + (f" (did you mean {close[0]}?)" if close else ""))
    p.error(f"unrecognized arguments: {' '.join(extra)}")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and argv[1:2] != ["throughput"]:  # the suite: kernels | e2e | all | report
        from .bench_cli import main as bench_main

        return bench_main(argv[1:])
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra:
        _unknown_option_error(_subparser(ap, [args.command] + ([args.bench] if args.command == "bench" else [])),
                              extra)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
