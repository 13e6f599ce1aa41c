"""`llmkern bench`: run the benchmark suite and write the report.

    llmkern bench [kernels|e2e|all] [--quick] [--out DIR] [--device cpu|cuda] [--only NAMES]
    llmkern bench report RESULTS.json [--out DIR]     # re-render a saved run
    ... --explorer [DB] | --no-explorer                # screenshot of `llmkern explore` over DB in the
                                                       # report (the suite: on, shipped DB; report: off)

The benchmark modules are the llmkern.bench package; the repository's bench/ folder holds only
thin entry scripts, the pytest-benchmark wrappers and the device/sanitizer scripts. The named
benchmarks (`llmkern bench throughput|serve|router|pd`) are cli/bench.py's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Optional

QUICK_BUDGET_S = 180  # `--quick` is meant to finish within 3 minutes on 2 cores


def _load():
    from ..bench import report, suite

    return suite, report


def _default_out() -> str:
    return os.path.join(os.getcwd(), "llmkern-bench", time.strftime("%Y%m%d-%H%M%S"))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llmkern bench",
        description="Benchmark llmkern against named peers measured in the same run; write a "
                    "JSON of all figures, a Markdown report and PNG plots.",
        epilog="Re-render a saved run: llmkern bench report RESULTS.json [--out DIR]. "
               "The end-to-end throughput benchmark alone: llmkern bench throughput --help. "
               "The same benchmarks under pytest-benchmark: pytest bench/ --benchmark-json=FILE.")
    ap.add_argument("which", nargs="?", default="all", choices=("kernels", "e2e", "all", "throughput", "report"),
                    help="kernels (attention, cache ops, sampling), e2e (runtime vs HF transformers), all "
                         "(default); throughput: the end-to-end offline throughput run alone "
                         "(llmkern bench throughput --help); report: re-render a saved run")
    ap.add_argument("--quick", action="store_true", help="small shapes and short timings (a few minutes in all)")
    ap.add_argument("--out", default=None, help="output folder (default: ./llmkern-bench/<time>)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where tensors live (default cpu)")
    ap.add_argument("--only", default="", help="comma-separated module filters, e.g. attention,cache_ops")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for llmkern and torch (default: all)")
    ap.add_argument("--no-plots", action="store_true", help="write JSON and Markdown only")
    ap.add_argument("--list", action="store_true", help="list the benchmark modules and exit")
    _add_explorer_arg(ap, default="shipped")
    return ap


def _add_explorer_arg(ap: argparse.ArgumentParser, default: Optional[str] = None) -> None:
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--explorer", nargs="?", const="shipped", default=default, metavar="DB",
                   help="add a screenshot of the Performance Explorer (`llmkern explore`) over runs database DB "
                        "(without DB: the shipped one) to the report; needs Chromium and plotly"
                        + (" (default: on)" if default else ""))
    g.add_argument("--no-explorer", dest="explorer", action="store_const", const=None,
                   help="no Performance Explorer screenshot in the report")


def _explorer(value: Optional[str]):
    """The report's Performance Explorer section over runs database `value` ("shipped": the one
    that comes with llmkern), or None."""
    from ..explore.report_section import explorer_section

    if value == "shipped":
        from ..optimize.db import default_db_path

        value = default_db_path()
    return explorer_section(value)


def _report_main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="llmkern bench report", description="Re-render a saved benchmark run.")
    ap.add_argument("results", help="results.json of a run, or a pytest-benchmark --benchmark-json file")
    ap.add_argument("--out", default=None, help="output folder (default: next to the JSON)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--headline", action="store_true",
                    help="print the headline table (Markdown, with the machine and command) and write nothing")
    _add_explorer_arg(ap)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.results):
        ap.error(f"results: no such file: {a.results}")
    _, report = _load()
    if a.headline:
        print(report.headline_markdown(report.load(a.results)))
        return 0
    out = a.out or os.path.dirname(os.path.abspath(a.results))
    paths = report.write_report(report.load(a.results), out, plots=not a.no_plots, extra=_explorer(a.explorer))
    _print_paths(paths)
    return 0


def _print_paths(paths: dict) -> None:
    print(f"report:  {paths['markdown']}")
    print(f"figures: {paths['json']}")
    for p in paths["plots"]:
        print(f"plot:    {p}")
    for n in paths["notes"]:
        print(f"note:    {n}")


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # tolerate being handed the whole `llmkern bench ...` tail
        argv = argv[1:]
    if argv[:1] == ["report"]:
        return _report_main(argv[1:])
    a = _parser().parse_args(argv)
    suite, report = _load()
    if a.list:
        for group, mods in suite.discover(suite.HERE).items():
            for m in mods:
                present = os.path.exists(os.path.join(suite.HERE, m + ".py"))
                print(f"{group:8} {m:24} {'' if present else '(not present)'}".rstrip())
        return 0
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("llmkern bench: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
            return 2
    if a.threads > 0:
        import torch

        from .._build import set_num_threads

        torch.set_num_threads(a.threads)
        set_num_threads(a.threads)
    out = a.out or _default_out()
    only = [s for s in a.only.split(",") if s.strip()] or None
    command = "llmkern bench " + " ".join(argv) if argv else "llmkern bench"
    os.makedirs(out, exist_ok=True)

    def save_partial(res: dict) -> None:  # a crash in a later module keeps what ran so far
        res["command"] = command
        report.write_report(res, out, plots=False)

    res = suite.run_suite(a.which, quick=a.quick, device=a.device, only=only, on_module=save_partial)
    res["command"] = command
    suite.common.print_records(res["records"])
    paths = report.write_report(res, out, plots=not a.no_plots, extra=_explorer(a.explorer))
    print()
    _print_paths(paths)
    print(f"total {res['elapsed_s']:.0f} s")
    if a.quick and res["elapsed_s"] > QUICK_BUDGET_S:
        slow = sorted(res["modules"], key=lambda m: -m["seconds"])[:3]
        print(f"warning: --quick took {res['elapsed_s']:.0f} s, over its {QUICK_BUDGET_S} s budget (slowest: "
              + ", ".join(f"{m['name']} {m['seconds']:.0f} s" for m in slow) + ")", file=sys.stderr)
    failed = [m["name"] for m in res["modules"] if m["status"] == "error"]
    if failed:
        print(f"failed modules: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
