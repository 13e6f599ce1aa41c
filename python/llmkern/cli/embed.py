"""`llmkern embed`: embeddings of a JSONL file (resumable)."""
from __future__ import annotations

import argparse

from ..engine.args import add_engine_args
from .jobs import add_job_args, run_job_command

HELP = "embeddings of a JSONL file (resumable; vLLM's embed shape)"


def add_args(e: argparse.ArgumentParser) -> None:
    e.add_argument("--input", required=True, help="JSONL file: one string or {\"input\"|\"prompt_token_ids\", "
                                                  "[\"id\"]} object per line")
    e.add_argument("--output", default=None, help="JSONL results {\"line\", \"id\", \"embedding\"} (default: stdout)")
    e.add_argument("--pooling", default="mean", choices=["mean", "last", "cls"],
                   help="mean of the final hidden states, the last token's, or the first token's")
    e.add_argument("--no-normalize", action="store_true", help="do not L2-normalise the embeddings")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    add_engine_args(e)
    add_job_args(e)


def run(a) -> int:
    from ..offline import EmbedTask

    return run_job_command(EmbedTask(a.pooling, normalize=not a.no_normalize), a)
