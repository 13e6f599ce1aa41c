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

One module per command (add_args / run); `bench` subcommands come from bench.BENCH_COMMANDS."""
from __future__ import annotations

import argparse
import difflib
import sys
from typing import List, Optional

from ..engine.args import HelpFormatter
from .version import VersionAction


def build_parser() -> argparse.ArgumentParser:
    # The command modules are imported here, not at the top: importing llmkern.cli stays light
    # (the device check collects tests that import it on a machine without the runtime's extras).
    from . import embed, generate, optimize, router, serve
    from .bench import BENCH_COMMANDS

    ap = argparse.ArgumentParser(prog="llmkern", description="llmkern: LLM inference kernels and a small runtime")
    ap.add_argument("--version", action=VersionAction, help="the version, the CUDA architectures and CPU levels "
                                                             "this build carries, and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{generate,bench}")
    commands = [("generate", generate.HELP, generate.add_args, generate.run, True),
                ("embed", embed.HELP, embed.add_args, embed.run, False),
                ("serve", serve.HELP, serve.add_args, serve.run, False),
                ("router", router.HELP, router.add_args, router.run, False),
                ("optimize", optimize.OPTIMIZE_HELP, optimize.add_optimize_args, optimize.run_optimize, True),
                ("estimate", optimize.ESTIMATE_HELP, optimize.add_estimate_args, optimize.run_estimate, True)]
    for name, help_, add_args, run, formatted in commands:
        p = sub.add_parser(name, help=help_, **({"formatter_class": HelpFormatter} if formatted else {}))
        add_args(p)
        p.set_defaults(func=run)

    from ..explore.cli import add_args as add_explore_args, run as run_explore

    x = sub.add_parser("explore", help="Performance Explorer: an interactive HTML page over a runs database "
                                       "(needs the explore extra)", formatter_class=HelpFormatter)
    add_explore_args(x)
    x.set_defaults(func=run_explore)

    b = sub.add_parser("bench", help="benchmarks: throughput (end-to-end vs HF), kernels, e2e, all, report "
                                     "(llmkern bench SUBCOMMAND --help)")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name, (help_, add_args, run) in BENCH_COMMANDS.items():
        p = bsub.add_parser(name, help=help_, formatter_class=HelpFormatter)
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
    from .bench import BENCH_COMMANDS

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and (not argv[1:2] or argv[1] not in BENCH_COMMANDS):  # the suite: kernels | e2e | all | report
        from .bench_suite import main as bench_main

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
