"""`llmkern generate`: one prompt streamed, or a JSONL batch job."""
from __future__ import annotations

import argparse
import sys

from ..engine.args import add_engine_args, add_sampling_args, as_option, sampling_dict
from .common import check_engine_args, check_writable, fail, make_llm
from .jobs import add_job_args, run_job_command

HELP = "generate text (one prompt streamed, or a JSONL batch)"


def add_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("prompt", nargs="?", default=None, help="the prompt (streamed answer)")
    g.add_argument("--input", default=None, help="JSONL file: one {\"prompt\"|\"messages\"|\"prompt_token_ids\", "
                                                 "[sampling fields], [\"id\"]} object per line")
    g.add_argument("--output", default=None, help="JSONL results, written as they finish (default: stdout)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the model's chat template to plain prompts")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    add_engine_args(g)
    add_sampling_args(g)
    add_job_args(g)


def run(a) -> int:
    if (a.prompt is None) == (a.input is None):
        raise SystemExit("llmkern generate: give either a prompt or --input FILE.jsonl")
    from ..engine import SamplingParams

    base = sampling_dict(a)
    try:
        SamplingParams(**base)
    except ValueError as e:
        raise fail(as_option(str(e)))
    check_engine_args(a)
    if a.input is not None:
        try:
            with open(a.input, "rb"):
                pass
        except OSError as e:
            raise fail(f"--input: cannot read {a.input!r}: {e.strerror or e}")
    if a.output is not None:
        check_writable(a.output)
    if a.input is not None:
        from ..offline import GenerateTask

        return run_job_command(GenerateTask(base, chat=not a.no_chat), a)
    llm = make_llm(a)
    has_template = bool(llm.tokenizer and llm.tokenizer.chat_template)
    try:
        from ..offline.tasks import to_prompt

        return _stream_one(llm, to_prompt(a.prompt, not a.no_chat, has_template), SamplingParams(**base), a)
    except RuntimeError as e:
        if type(e).__name__ == "DistributedError":  # a worker died or hung: say so, no traceback
            raise fail(str(e))
        raise
    finally:
        llm.shutdown()  # stops the worker processes of a model-parallel engine


def _stream_one(llm, prompt, sp, a) -> int:
    from ..engine.metrics import format_summary

    eng = llm.engine
    try:
        rid = eng.add_request(prompt, sp, stream=True)
    except (ValueError, TypeError) as e:
        raise fail(str(e))
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
        raise fail(f"generation failed: {type(e).__name__}: {e}")
    sys.stdout.write("\n")
    if final is not None and not a.quiet:
        m = final.metrics
        print(f"[{final.finish_reason}] {m.num_prompt_tokens} prompt + {m.num_output_tokens} output tokens, "
              f"TTFT {1e3 * (m.ttft or 0):.1f} ms, "
              f"{m.num_output_tokens / max(m.e2e or 1e-9, 1e-9):.1f} tok/s", file=sys.stderr)
        print(format_summary(llm.run_metrics()), file=sys.stderr)
    return 0
