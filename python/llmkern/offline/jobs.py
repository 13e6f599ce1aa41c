"""A resumable offline job: read the JSONL input, skip the lines whose results are already in the
output (resume), run the rest on one machine or on Ray, write each result as it finishes, then put
the file in input order (results.py has the file's guarantees).

    from llmkern.offline import GenerateTask, run_job
    summary = run_job(GenerateTask({"max_tokens": 64}), "in.jsonl", "out.jsonl", mode="resume",
                      llm_factory=lambda: LLM(schedule="throughput"))
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .jsonl import read_items
from .results import JobError, ResultsFile, dumps


@dataclass
class JobSummary:
    lines: int = 0              # input lines (non-blank)
    skipped: int = 0            # already done by an earlier run
    done: int = 0               # results written by this run
    errors: int = 0             # error records written by this run
    prompt_tokens: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    complete: bool = False      # every line has a result and the file is in input order
    dropped: int = 0            # results of ids no longer in the input, left out of the final file
    engine: Optional[dict] = None  # the local engine's run metrics (Engine.run_metrics)

    def cost_per_million(self, price_per_hour: float) -> Optional[float]:
        """Cost of a million tokens (prompt + output) at the given price per hour of the machines."""
        toks = self.prompt_tokens + self.output_tokens
        return price_per_hour * self.elapsed_s / 3600 / toks * 1e6 if toks else None

    def format(self, price_per_hour: Optional[float] = None) -> str:
        t = max(self.elapsed_s, 1e-9)
        s = (f"{self.done} of {self.lines} lines in {self.elapsed_s:.2f} s ({self.skipped} done before, "
             f"{self.errors} errors) | prompt {self.prompt_tokens / t:.1f} tok/s, output {self.output_tokens / t:.1f} "
             f"tok/s, total {(self.prompt_tokens + self.output_tokens) / t:.1f} tok/s")
        if price_per_hour is not None:
            c = self.cost_per_million(price_per_hour)
            if c is not None:
                s += f" | ${c:.4f} per million tokens at ${price_per_hour:g}/h"
                if self.output_tokens:
                    s += f" (${price_per_hour * self.elapsed_s / 3600 / self.output_tokens * 1e6:.4f} per million output)"
        return s


def run_job(task, input_path: str, output_path: Optional[str], mode: Optional[str] = None, *,
            llm_factory: Optional[Callable] = None, run_elsewhere: Optional[Callable] = None,
            progress: bool = True) -> JobSummary:
    """Run `task` (GenerateTask / EmbedTask) over input_path. output_path None: records go to stdout in
    completion order (not resumable). mode: "resume" | "overwrite" | None (refuse to touch a file
    holding results). llm_factory() builds the engine for a local run; run_elsewhere(task, items,
    emit) runs the lines somewhere else instead (e.g. llmkern.integrations.ray.run_on_ray on Ray Data). Raises JobError on a
    bad input/output path before any model is loaded."""
    try:
        items = read_items(input_path)
    except OSError as e:
        raise JobError(f"--input: cannot read {input_path!r}: {e.strerror or e}") from None
    out = ResultsFile(output_path, mode) if output_path is not None else None
    summary = JobSummary(lines=len(items))
    todo = [it for it in items if out is None or not out.done(it)]
    summary.skipped = len(items) - len(todo)
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc=task.name, unit="line", dynamic_ncols=True, file=sys.stderr)

    def emit(it, rec):
        if out is not None:
            out.write(it, rec)
        else:
            sys.stdout.write(dumps(rec))
            sys.stdout.flush()
        if "error" in rec:
            summary.errors += 1
            msg = f"llmkern: {input_path}:{it.line}: skipped: {rec['error']}"
            bar.write(msg, file=sys.stderr) if bar is not None else print(msg, file=sys.stderr)
        else:
            summary.done += 1
            m = rec.get("metrics") or {}
            summary.prompt_tokens += m.get("prompt_tokens", 0)
            summary.output_tokens += m.get("output_tokens", 0)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{(summary.prompt_tokens + summary.output_tokens) / max(time.perf_counter() - t0, 1e-9):.0f} tok/s")

    t0 = time.perf_counter()
    try:
        if todo:
            if run_elsewhere is not None:
                run_elsewhere(task, todo, emit)
            else:
                t_load = time.perf_counter()
                llm = llm_factory()
                t0 += time.perf_counter() - t_load  # throughput counts the run, not the model load
                if out is not None:
                    out.open()
                try:
                    task.run(llm, todo, emit)
                    summary.engine = llm.run_metrics()
                finally:
                    llm.shutdown()  # stops the worker processes of a model-parallel engine
        summary.elapsed_s = time.perf_counter() - t0
        if out is not None:
            summary.dropped = out.finalize(items)
        summary.complete = True
    finally:
        if bar is not None:
            bar.close()
        if out is not None:
            out.close()
        summary.elapsed_s = summary.elapsed_s or time.perf_counter() - t0
    return summary
