"""The `llmkern` command.

    llmkern generate "prompt"                               stream one answer (embedded default model)
    llmkern generate --input prompts.jsonl --output out.jsonl   offline batch job + summary (resumable)
    llmkern embed --input texts.jsonl --output emb.jsonl        embeddings (resumable)
    llmkern serve                                           OpenAI-compatible server (needs llmkern[serve])
    llmkern serve --data-parallel-size 2                    two replicas behind a KV-aware router
    llmkern router --worker URL [--worker URL ...]          the router alone, in front of replicas anywhere
    llmkern serve --pd 1P1D                                 a prefill and a decode replica behind a router
    llmkern router --pd --prefill URL --decode URL          the router pairing prefill and decode replicas
    llmkern bench throughput                                end-to-end benchmark vs HF transformers
    llmkern bench serve                                     serving benchmark (policies, HF's server)
    llmkern optimize --sweep "max_num_seqs=[8,32]" --constraints "ttft:p95<500ms"   configuration sweep
    llmkern estimate --concurrency 8                        predicted TTFT/ITL/throughput (calibrated)
    llmkern explore [--db runs.sqlite] [--serve]            Performance Explorer page over a runs database

`bench` subcommands come from the BENCH_COMMANDS registry below (add an entry to plug in more)."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
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
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="exactly this many KV-cache blocks, whatever the memory (benchmarks, tests)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    g.add_argument("--no-chunked-prefill", action="store_true", help="run each prompt's prefill in one step")
    g.add_argument("--cpu-offload-gb", type=float, default=0.0, help="host tier for evicted prefix blocks, GiB")
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"],
                   help="what preemption does with a sequence's KV blocks")
    g.add_argument("--scheduler", default="continuous", choices=["continuous", "static", "dynamic"],
                   help="continuous batching; static: a batch runs to completion before the next; dynamic: "
                        "static, started once --max-batch-size wait or the oldest waited --max-wait-ms")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split every layer over this many processes (Megatron-style)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="split the layers into this many stages, one process group each")
    g.add_argument("--expert-parallel-size", "-ep", type=int, default=1,
                   help="MoE models: spread the experts over this many processes (tokens dispatched with "
                        "all-to-all; attention tensor-parallel over the same processes)")
    g.add_argument("--distributed-timeout-s", type=float, default=60.0,
                   help="with -tp/-pp: a collective not complete by then stops the engine with an error")
    g.add_argument("--speculative", default=None, metavar="METHOD[:K][,key=value...]",
                   help="speculative decoding, e.g. ngram:4 (prompt lookup), early_exit:3,num_layers=12, "
                        "draft:4,model=PATH (default: off)")


def _engine_kwargs(a) -> dict:
    return dict(device=a.device, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
                kv_cache_memory_gb=a.kv_cache_memory_gb, num_gpu_blocks=getattr(a, "num_gpu_blocks_override", None),
                enable_prefix_caching=not a.no_prefix_caching,
                enable_chunked_prefill=not a.no_chunked_prefill, cpu_offload_gb=a.cpu_offload_gb,
                preemption_mode=a.preemption_mode, scheduler=a.scheduler,
                speculative=getattr(a, "speculative", None), policy=getattr(a, "policy", "fcfs"),
                max_wait_ms=getattr(a, "max_wait_ms", 0.0),
                tensor_parallel_size=a.tensor_parallel_size, pipeline_parallel_size=a.pipeline_parallel_size,
                expert_parallel_size=a.expert_parallel_size,
                distributed_timeout_s=a.distributed_timeout_s, schedule=getattr(a, "schedule", "arrival"),
                **_role_kwargs(a))


def _role_kwargs(a) -> dict:
    """A serve --role prefill|decode engine's KV-connector settings (none for a co-located one)."""
    if getattr(a, "role", "both") == "both":
        return {}
    from .serve.pd import engine_kwargs

    return engine_kwargs(a)


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


_CONFIG_FLAGS = {"num_gpu_blocks": "num_gpu_blocks_override"}   # config field -> flag, where they differ


def _as_option(msg: str) -> str:
    """'max_tokens: expected ...' -> '--max-tokens: expected ...' (errors name the flag the user typed)."""
    field, sep, rest = msg.partition(":")
    if sep and field.isidentifier():
        field = _CONFIG_FLAGS.get(field, field)
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
    except RuntimeError as e:
        if str(e).startswith("distributed:"):  # a rank failed to start or to load its shard
            raise _fail(str(e))
        raise _fail(f"could not load the model: {type(e).__name__}: {e}")
    except (OSError, MemoryError) as e:  # e.g. a file that vanished, out of memory
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
    if a.input is not None:
        try:
            with open(a.input, "rb"):
                pass
        except OSError as e:
            raise _fail(f"--input: cannot read {a.input!r}: {e.strerror or e}")
    if a.output is not None:
        _check_writable(a.output)
    if a.input is not None:
        from .offline import GenerateTask

        return _run_job(GenerateTask(base, chat=not a.no_chat), a)
    llm = _make_llm(a)
    has_template = bool(llm.tokenizer and llm.tokenizer.chat_template)
    try:
        from .offline.tasks import to_prompt

        return _stream_one(llm, to_prompt(a.prompt, not a.no_chat, has_template), SamplingParams(**base), a)
    except RuntimeError as e:
        if type(e).__name__ == "DistributedError":  # a worker died or hung: say so, no traceback
            raise _fail(str(e))
        raise
    finally:
        llm.shutdown()  # stops the worker processes of a model-parallel engine


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


def _add_job_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("offline job (--input)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--resume", action="store_true",
                   help="--output holds results of an earlier run of this job: keep them, run only the rest")
    m.add_argument("--overwrite", action="store_true", help="discard results already in --output")
    g.add_argument("--schedule", default="throughput", choices=["throughput", "arrival"],
                   help="throughput: prompts sharing a prefix grouped and the prefix computed once, biggest "
                        "groups first (default); arrival: input order")
    g.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                   help="machine price per hour: the summary adds the cost per million tokens")
    g.add_argument("--ray", action="store_true", help="run the lines on Ray Data (pip install 'llmkern[ray]')")
    g.add_argument("--ray-address", default=None, help="existing Ray cluster (default: start a local one)")
    g.add_argument("--ray-actors", type=int, default=1, help="engines (Ray actors), one per replica")
    g.add_argument("--ray-cpus-per-actor", type=float, default=1.0)
    g.add_argument("--ray-gpus-per-actor", type=float, default=0.0)
    g.add_argument("--ray-batch-size", type=int, default=64, help="lines per map_batches call")


def _run_job(task, a) -> int:
    from .offline import JobError, run_job

    if a.price_per_hour is not None and a.price_per_hour < 0:
        raise SystemExit("llmkern: --price-per-hour: expected a price >= 0")
    if a.ray and a.output is None:
        raise SystemExit("llmkern: --ray needs --output")
    mode = "resume" if a.resume else "overwrite" if a.overwrite else None
    ray_options = None
    if a.ray:
        if a.ray_actors < 1 or a.ray_batch_size < 1:
            raise SystemExit("llmkern: --ray-actors and --ray-batch-size: expected integers >= 1")
        ray_options = dict(model=a.model, load_format=a.load_format, engine_kwargs=_engine_kwargs(a),
                           address=a.ray_address, num_actors=a.ray_actors, batch_size=a.ray_batch_size,
                           num_cpus=a.ray_cpus_per_actor, num_gpus=a.ray_gpus_per_actor, progress=not a.quiet)
    try:
        s = run_job(task, a.input, a.output, mode, llm_factory=lambda: _make_llm(a), ray_options=ray_options,
                    progress=not a.quiet)
    except JobError as e:
        raise SystemExit(f"llmkern: {e}")
    except KeyboardInterrupt:
        if a.output:
            print(f"llmkern: interrupted; finished results are in {a.output} (run again with --resume)",
                  file=sys.stderr)
        return 130
    if not a.quiet:
        from .engine.metrics import format_summary

        if s.engine is not None:
            print(format_summary(s.engine), file=sys.stderr)
        print(s.format(a.price_per_hour) + (f" | {s.errors} bad line(s) skipped" if s.errors else "")
              + (f" | {s.dropped} result(s) of ids no longer in the input dropped" if s.dropped else ""),
              file=sys.stderr)
    return 1 if s.errors else 0


def _cmd_embed(a) -> int:
    from .offline import EmbedTask

    return _run_job(EmbedTask(a.pooling, normalize=not a.no_normalize), a)


# -- serve -------------------------------------------------------------------------------------
_SERVE_HINT = "llmkern serve needs the serve extra: pip install 'llmkern[serve]'"


def _cmd_serve(a) -> int:
    from .serve.config import ServeConfig

    try:
        from .serve.app import default_model_name
        from .serve.server import run_server
    except ImportError as e:
        raise SystemExit(f"{_SERVE_HINT} ({e})")
    if a.max_batch_size is not None:
        a.max_num_seqs = a.max_batch_size
    try:
        cfg = ServeConfig.from_args(a)
    except ValueError as e:
        raise SystemExit(f"llmkern serve: {e}")
    if a.data_parallel_size < 1:
        raise SystemExit(f"llmkern serve: --data-parallel-size: expected an integer >= 1, got {a.data_parallel_size}")
    from .serve.pd import check_pd_args

    problem = check_pd_args(a)
    if problem:
        raise SystemExit(f"llmkern serve: {problem}")
    if a.pd is not None:
        from .router.pd_launch import parse_pd_spec, run_pd

        try:
            parse_pd_spec(a.pd)
        except ValueError as e:
            raise SystemExit(f"llmkern serve: {e}")
        _check_engine_args(a)
        return run_pd(a, a.argv[1:])
    if a.data_parallel_size > 1:
        from .router.launch import run_data_parallel

        return run_data_parallel(a, a.argv[1:])
    engine = _make_llm(a).engine
    return run_server(engine, cfg, cfg.served_model_name or default_model_name(a.model), a.log_level)


def _cmd_explore(a) -> int:
    from .explore.cli import run

    return run(a)


def _cmd_router(a) -> int:
    try:
        from .router.core import Router
        from .router.launch import _router_tokenizer, run_router
    except ImportError as e:
        raise SystemExit(f"{_SERVE_HINT} ({e})")
    try:
        tok = _router_tokenizer(a.model) if a.model else None
        if a.pd:
            from .router.pd import PDRouter

            if a.worker:
                raise ValueError("--worker: in --pd mode replicas are given as --prefill URL and --decode URL")
            router = PDRouter(a.prefill or [], a.decode or [], policy=a.policy, tokenizer=tok)
        elif a.prefill or a.decode:
            raise ValueError("--prefill/--decode: only with --pd")
        else:
            router = Router(a.worker or [], policy=a.policy, tokenizer=tok)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"llmkern router: {e}")
    if tok is None:
        print("llmkern router: no --model given: prompts are not tokenised, so only token-id prompts are routed "
              "by their cached prefix", file=sys.stderr)
    return run_router(router, a.host, a.port, admin_key=a.admin_key, log_level=a.log_level)


def _add_router_args(p: argparse.ArgumentParser) -> None:
    from .router.policies import POLICIES

    p.add_argument("--worker", action="append", default=None, metavar="URL",
                   help="a replica (`llmkern serve`) base URL, e.g. http://10.0.0.5:8000; repeat for more; more "
                        "can be added at run time with POST /admin/workers")
    p.add_argument("--model", default=None, help="the replicas' model (its tokenizer is loaded to match prefixes)")
    p.add_argument("--pd", action="store_true",
                   help="prefill-decode mode: each request is prefilled on a --prefill replica and continued on "
                        "a --decode replica (which gets the KV blocks)")
    p.add_argument("--prefill", action="append", default=None, metavar="URL",
                   help="with --pd: a `llmkern serve --role prefill` replica; repeat for more")
    p.add_argument("--decode", action="append", default=None, metavar="URL",
                   help="with --pd: a `llmkern serve --role decode` replica; repeat for more")
    p.add_argument("--policy", default="cache_aware", choices=POLICIES)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--admin-key", default=None, help="require header X-Admin-Key on /admin routes")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])


def _bench_router_args(p: argparse.ArgumentParser) -> None:
    from .bench.routing import add_args

    add_args(p)


def _bench_router(a) -> int:
    from .bench.routing import run_bench

    run_bench(a)
    return 0


def _bench_pd_args(p: argparse.ArgumentParser) -> None:
    from .bench.disagg import add_args

    add_args(p)


def _bench_pd(a) -> int:
    from .bench.disagg import run_bench

    run_bench(a)
    return 0


# -- bench -------------------------------------------------------------------------------------
def _bench_throughput_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer requests and tokens")
    p.add_argument("--num-requests", type=int, default=None, help="override the request count (e.g. 256)")
    p.add_argument("--no-peers", action="store_true", help="skip HF transformers")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", default=None, help="also write the records to this file")


def _bench_throughput(a) -> int:
    import importlib.util

    from .bench import throughput as benchmark

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
def _bench_serve_args(p: argparse.ArgumentParser) -> None:
    from .bench.serving import add_args

    add_args(p)


def _bench_serve(a) -> int:
    try:
        from .bench.serving import main as bench_main
    except ImportError as e:
        raise SystemExit(f"{_SERVE_HINT} ({e})")
    return bench_main(a)


BENCH_COMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "throughput": ("end-to-end offline throughput (offline-32 workload) vs HF transformers",
                   _bench_throughput_args, _bench_throughput),
    "serve": ("serving: open-loop Poisson load on `llmkern serve` (three policies) vs HF's `transformers serve`",
              _bench_serve_args, _bench_serve),
    "router": ("routing: multi-tenant Poisson load on N replicas behind the router, per policy (hit rate, TTFT)",
               _bench_router_args, _bench_router),
    "pd": ("prefill-decode disaggregation: chat decoding + long-prompt bursts, co-located vs 1P1D (TTFT, ITL, KV "
           "bytes moved)", _bench_pd_args, _bench_pd),
}


# -- optimize / estimate --------------------------------------------------------------------------
def _cmd_optimize(a) -> int:
    from .optimize.cli import run_optimize
    from .optimize.db import SchemaError

    try:
        return run_optimize(a)
    except (ValueError, SchemaError, FileNotFoundError) as e:
        raise _fail(f"optimize: {e}")


def _cmd_estimate(a) -> int:
    from .optimize.cli import run_estimate

    try:
        return run_estimate(a)
    except (ValueError, FileNotFoundError) as e:
        raise _fail(f"estimate: {e}")


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
    _add_job_args(g)
    g.set_defaults(func=_cmd_generate)

    e = sub.add_parser("embed", help="embeddings of a JSONL file (resumable; vLLM's embed shape)")
    e.add_argument("--input", required=True, help="JSONL file: one string or {\"input\"|\"prompt_token_ids\", "
                                                  "[\"id\"]} object per line")
    e.add_argument("--output", default=None, help="JSONL results {\"line\", \"id\", \"embedding\"} (default: stdout)")
    e.add_argument("--pooling", default="mean", choices=["mean", "last", "cls"],
                   help="mean of the final hidden states, the last token's, or the first token's")
    e.add_argument("--no-normalize", action="store_true", help="do not L2-normalise the embeddings")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    _add_model_args(e)
    _add_job_args(e)
    e.set_defaults(func=_cmd_embed)

    from .serve.config import add_serve_args

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)")
    _add_model_args(sv)
    add_serve_args(sv)
    dp = sv.add_argument_group("data parallelism")
    dp.add_argument("--data-parallel-size", type=int, default=1,
                    help="N > 1: N replicas (the CPUs split between them, or one GPU each) behind a router on --port")
    dp.add_argument("--router-policy", default="cache_aware",
                    choices=["cache_aware", "approx_tree", "least_load", "round_robin"])
    from .serve.pd import add_pd_args

    add_pd_args(sv)
    sv.set_defaults(func=_cmd_serve)

    r = sub.add_parser("router", help="KV-cache-aware router in front of llmkern serve replicas")
    _add_router_args(r)
    r.set_defaults(func=_cmd_router)

    op = sub.add_parser("optimize", help="sweep server configurations on a workload under latency constraints "
                                         "(results in an SQLite runs database)", formatter_class=_HelpFormatter)
    from .optimize.cli import add_estimate_args, add_optimize_args

    add_optimize_args(op)
    op.set_defaults(func=_cmd_optimize)
    es = sub.add_parser("estimate", help="predicted step times, TTFT/ITL/throughput and limits for a model on "
                                         "a hardware profile (--calibrate measures this machine)",
                        formatter_class=_HelpFormatter)
    add_estimate_args(es)
    es.set_defaults(func=_cmd_estimate)

    from .explore.cli import add_args as add_explore_args

    x = sub.add_parser("explore", help="Performance Explorer: an interactive HTML page over a runs database "
                                       "(needs the explore extra)", formatter_class=_HelpFormatter)
    add_explore_args(x)
    x.set_defaults(func=_cmd_explore)

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
    if argv[:1] == ["bench"] and (not argv[1:2] or argv[1] not in BENCH_COMMANDS):  # the suite: kernels | e2e | all | report
        from .bench.cli import main as bench_main

        return bench_main(argv[1:])
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra:
        _unknown_option_error(_subparser(ap, [args.command] + ([args.bench] if args.command == "bench" else [])),
                              extra)
    args.argv = argv
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
