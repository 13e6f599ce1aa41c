"""Benchmark report: JSON of all figures, a Markdown report and PNG plots.

    python -m llmkern.bench.report RESULTS.json [--out DIR]    # re-render a saved run
                                                       # (or a pytest-benchmark --benchmark-json file)

The plots are report_plots.py's.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Callable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))

from llmkern.bench.common import Record, fmt_seconds  # noqa: E402
# (the plots' names stay importable from here: tests and scripts read them through report)
from llmkern.bench.report_plots import (HEADLINE_CASES, LEGACY, MATPLOTLIB_NOTE, PLOTS,  # noqa: E402,F401
                                        _series, axis_value, draw_plots, headline_records)

# ---- tables --------------------------------------------------------------------------------------
def _fmt_value(v: Optional[float], metric: str) -> str:
    if v is None:
        return ""
    if abs(v) >= 100:
        return f"{v:,.0f} {metric}"
    return f"{v:.3g} {metric}" if abs(v) < 10 else f"{v:.1f} {metric}"


def _cells(r: Record) -> list:
    lk = fmt_seconds(r.llmkern_s)
    if r.llmkern_value is not None and not r.is_time_metric:
        lk += f" ({_fmt_value(r.llmkern_value, r.metric)})"
    elif r.metric and r.is_time_metric and r.metric.split(" ", 1)[1:]:
        lk += f" ({r.metric.split(' ', 1)[1]})"  # what the time is, e.g. TTFT
    peer = f"{r.peer}: {fmt_seconds(r.peer_s)}" if r.peer_s else (r.peer or "-")
    if r.peer_s and r.peer_value is not None and not r.is_time_metric:
        peer += f" ({_fmt_value(r.peer_value, r.metric)})"
    if r.peer_s and r.extra.get("agreement_prefix") is not None:  # peer_e2e: same greedy tokens?
        peer += f"; greedy tokens agree {100 * r.extra['agreement_prefix']:.1f}%"
    if not r.peer_s and r.extra.get("note"):  # why the peer has no figure (e.g. not installed)
        peer += f" (not measured: {r.extra['note']})"
    ratio = f"**{r.ratio:.2f}x**" if r.ratio else "-"
    frac = r.limit_fraction
    if frac is None:
        lim = "-"
    elif r.limit:
        lim = f"{100 * frac:.0f}% of {_fmt_value(r.limit, r.metric)}"
    else:  # a fraction given directly (e.g. of the matmul roofline)
        lim = f"{100 * frac:.0f}%" + (" of the matmul roofline" if "roofline_fraction" in r.extra else "")
    return [f"`{r.bench}`", r.case, lk, peer, ratio, lim]


def _table(rows: list, header: list) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return lines


# The case a benchmark's headline row shows when no record is marked extra["headline"]:
# (bench prefix, case pattern), the shapes the targets are stated for; else the last case.
def _ratio_span(records: list, bench: str, peer: str) -> str:
    rs = [r.ratio for r in records if r.bench == bench and r.peer == peer and r.ratio]
    if len(rs) < 2:
        return ""
    g = math.exp(sum(math.log(x) for x in rs) / len(rs))
    return f"{g:.2f}x ({min(rs):.2f}-{max(rs):.2f}x, {len(rs)} cases)"


def headline_table(records: list) -> list:
    header = ["benchmark", "case", "llmkern", "peer", "ratio", "% of machine limit", "ratio over all cases (geomean, range)"]
    rows = [_cells(r) + [_ratio_span(records, r.bench, r.peer) or "-"] for r in headline_records(records)]
    return _table(rows, header)


def headline_markdown(res: dict) -> str:
    """The headline table with one line on the machine and the command (for a README)."""
    records = [as_record(r) for r in res.get("records", [])]
    m, lim = res.get("machine", {}), res.get("limits", {})
    cpus = m.get("cpu_affinity") or m.get("cpu_count")
    machine = f"{m.get('cpu_model', '?')}, {cpus} CPUs, {m.get('simd', '?')}"
    if lim.get("copy_bandwidth_Bps"):
        machine += (f"; measured copy {_gb(lim['copy_bandwidth_Bps'])}, read {_gb(lim.get('read_bandwidth_Bps'))}"
                    f", fp32 matmul {lim.get('matmul_float32_flops', 0) / 1e9:,.0f} GFLOP/s")
    for g in m.get("gpus") or []:
        machine += f"; {g['name']}"
    lines = [f"`{command_line(res)}` on {machine} ({res.get('started', '?')}):", ""]
    lines += headline_table(records)
    busy = _busy_note(res)
    return "\n".join(lines + (["", busy] if busy else [])) + "\n"


def _gb(v) -> str:
    return f"{v / 1e9:.1f} GB/s" if v else "-"


def machine_lines(res: dict) -> list:
    m, lim = res.get("machine", {}), res.get("limits", {})
    rows = []
    cores = f"{m.get('cpu_count')} logical CPUs"
    if m.get("cpu_affinity") and m.get("cpu_affinity") != m.get("cpu_count"):
        cores += f", {m['cpu_affinity']} usable"
    threads = f"torch {m.get('torch_threads')} / llmkern {m.get('llmkern_threads')} threads"
    rows.append(["CPU", f"{m.get('cpu_model', '?')} ({cores}; {threads})"])
    if m.get("simd"):
        rows.append(["SIMD", f"{m['simd']} in use (CPU supports {m.get('simd_supported')}; built: "
                             f"{', '.join(m.get('simd_compiled') or [])})"])
    if m.get("cpu_flags") is not None:
        rows.append(["CPU features", ", ".join(m["cpu_flags"]) or "none of " + "/".join(("avx2", "avx512", "amx"))])
    if m.get("cpu_kernels"):
        rows.append(["Kernel paths", "; ".join(f"{k}: {v}" for k, v in m["cpu_kernels"].items())])
    mem = m.get("memory_bytes")
    rows.append(["Memory", (f"{mem / 2**30:.1f} GiB" if mem else "?") + f", last-level cache {m.get('llc_bytes', 0) >> 20} MiB"])
    for g in m.get("gpus") or []:
        clocks = ""
        if g.get("max_sm_clock_mhz"):
            clocks = (f", SM clock {g['sm_clock_mhz']}/{g['max_sm_clock_mhz']} MHz, memory clock "
                      f"{g['mem_clock_mhz']}/{g['max_mem_clock_mhz']} MHz, power limit {g['power_limit_w']} W, driver {g['driver']}")
        rows.append(["GPU", f"{g['name']} (sm_{g['capability'].replace('.', '')}, {g['sms']} SMs, {g['memory_gib']} GiB{clocks})"])
    if not m.get("gpus"):
        rows.append(["GPU", "none"])
    if lim:
        rows.append([f"Measured copy bandwidth ({lim.get('device')})", _gb(lim.get("copy_bandwidth_Bps")) + " (bytes read + written; best of torch copy_ and memcpy over 256 MiB)"])
        rows.append([f"Measured read bandwidth ({lim.get('device')})", _gb(lim.get("read_bandwidth_Bps")) + " (torch sum over 256 MiB on huge pages, best batch)"])
        mm = [f"{k.split('_')[1]} {v / 1e9:,.{0 if v >= 1e10 else 2}f} GFLOP/s"  # torch bf16 on AVX2: < 1
              for k, v in lim.items() if k.startswith("matmul_")]
        side = 8192 if str(lim.get("device", "cpu")).startswith("cuda") else 1024
        rows.append([f"Measured matmul ({lim.get('device')})", ", ".join(mm) + f" (torch.mm {side}^3, best batch)"])
    if m.get("loadavg"):
        end = res.get("loadavg_end")
        rows.append(["Load average (1, 5, 15 min)", "start " + ", ".join(f"{x:.2f}" for x in m["loadavg"])
                     + ("; end " + ", ".join(f"{x:.2f}" for x in end) if end else "")])
    if m.get("platform"):
        rows.append(["Platform", m["platform"]])
    vers = m.get("versions") or {}
    rows.append(["Versions", ", ".join(f"{k} {v}" for k, v in vers.items())])
    return _table(rows, ["", ""])


def command_line(res: dict) -> str:
    if res.get("command"):
        return res["command"]
    parts = ["llmkern bench", res.get("suite", "all")]
    if res.get("quick"):
        parts.append("--quick")
    if res.get("device", "cpu") != "cpu":
        parts.append(f"--device {res['device']}")
    if res.get("only"):
        parts.append("--only " + ",".join(res["only"]))
    return " ".join(parts)


def _busy_note(res: dict) -> str:
    """A warning when other work competed for the CPUs during the run (1-minute load average
    above the CPU count, at the start or at the end)."""
    m = res.get("machine", {})
    cpus = m.get("cpu_affinity") or m.get("cpu_count") or 0
    loads = [la[0] for la in (m.get("loadavg"), res.get("loadavg_end")) if la]
    if not cpus or not loads or max(loads) <= cpus + 0.5:
        return ""
    return (f"**Note: the machine was busy** (1-minute load average {max(loads):.1f} on {cpus} CPUs): other "
            "work competed for the cores, so absolute figures and the fractions of the machine limit are low and "
            "noisy; ratios suffer less (llmkern and its peer ran in the same conditions) but are noisy too.")


def sass_lines(sass: Optional[dict]) -> list:
    """The static SASS table of bench/sass_stats.py (res["sass"]), when the run has one."""
    if not sass or not sass.get("kernels"):
        return []
    rows = []
    for k in sorted(sass["kernels"], key=lambda k: (k["unit"], k["kernel"])):
        occ = k.get("occupancy") or {}
        rows.append([f"`{k['kernel']}`", str(k.get("hmma_main_loop") or "-"),
                     f"{k['per_hmma']:.2f}" if k.get("per_hmma") is not None else "-", str(k.get("regs", "?")),
                     f"{k.get('spill_stores', 0)}/{k.get('spill_loads', 0)}",
                     str(k.get("smem_static", 0) + k.get("smem_dynamic", 0)), str(occ.get("ctas_per_sm", "?"))])
    return (["", f"## CUDA kernels: static SASS figures ({sass.get('arch', '?')})", "",
             "From `bench/sass_stats.py` (no GPU needed): the main loop is the innermost loop with the most tensor-core "
             "instructions; *other / HMMA* counts its remaining instructions per HMMA, each once.", ""]
            + _table(rows, ["kernel", "HMMA in main loop", "other / HMMA", "registers", "spills (B st/ld)",
                            "shared memory (B)", "CTAs / SM"]))


def markdown(res: dict, records: list, plots: list, plot_notes: list, explorer: Optional[list] = None) -> str:
    mode = "quick" if res.get("quick") else "full"
    lines = ["# llmkern benchmark report", "",
             f"`{command_line(res)}` - {res.get('started', '?')} - {mode} mode on {res.get('device', 'cpu')}"
             + (f" - {res['elapsed_s']:.0f} s" if res.get("elapsed_s") is not None else ""), "",
             "Every figure is llmkern next to a named peer measured in the same process. "
             "**ratio** = peer time / llmkern time (> 1: llmkern is faster). **% of machine limit** = "
             "llmkern's figure over the limit measured in this run (memory bandwidth for cache ops, "
             "decode and sampling; matmul FLOP/s for prefill; see each module for its byte/FLOP count).", "",
             ]
    busy = _busy_note(res)
    if busy:
        lines += [busy, ""]
    lines += ["## Machine", ""]
    lines += machine_lines(res)
    lines += ["", "## Headline", ""]
    lines += headline_table(records) if records else ["No figures were produced."]
    lines += ["", "## All figures", ""]
    if records:
        lines += _table([_cells(r) for r in records],
                        ["benchmark", "case", "llmkern", "peer", "ratio", "% of machine limit"])
    lines += ["", "## Plots", ""]
    for title, fn in plots:
        lines += [f"### {title}", "", f"![{title}]({fn})", ""]
    for n in plot_notes:
        lines.append(f"- {n}")
    lines += sass_lines(res.get("sass"))
    lines += explorer or []
    mods = res.get("modules") or []
    if mods:
        lines += ["", "## Modules", ""]
        lines += _table([[f"`{m['name']}`", m.get("suite", ""), m["status"], f"{m.get('seconds', 0):.1f} s",
                          m.get("records", ""), m.get("note", "")] for m in mods],
                        ["module", "suite", "status", "time", "figures", "note"])
    lines += ["", "Timings are medians over batches of calls after warm-up; on a shared machine "
              "other load adds noise (see the load average above)."]
    return "\n".join(lines) + "\n"


# ---- files -----------------------------------------------------------------------------------------
def to_json(res: dict, records: list) -> dict:
    out = {k: v for k, v in res.items() if k != "records"}
    out["records"] = [r.as_dict() for r in records]
    return out


def write_report(res: dict, out_dir: str, plots: bool = True,
                 extra: Optional[Callable[[str], Tuple[List[str], List[str]]]] = None) -> dict:
    """Write results.json, report.md and the plots into out_dir; returns their paths. extra(out_dir)
    -> (Markdown lines, files it wrote): one more section with its pictures (with plots only), e.g.
    the Performance Explorer's screenshot (llmkern.explore.report_section)."""
    os.makedirs(out_dir, exist_ok=True)
    records = [as_record(r) for r in res.get("records", [])]
    made, notes = draw_plots(records, out_dir, res.get("limits")) if plots else ([], ["plots disabled (--no-plots)."])
    explorer, extra_files = extra(out_dir) if plots and extra is not None else ([], [])
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "report.md")}
    with open(paths["json"], "w") as f:
        json.dump(to_json(res, records), f, indent=1, default=str)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(res, records, made, notes, explorer))
    paths["plots"] = [os.path.join(out_dir, fn) for _, fn in made]
    paths["plots"] += extra_files
    paths["notes"] = notes
    return paths


def as_record(r) -> Record:
    """A Record from a Record or a saved dict; a dict saved before Record.axes existed is marked
    LEGACY so that its plot coordinates are guessed from its case as they were then."""
    if isinstance(r, Record):
        return r
    rec = Record.from_dict(r)
    if "axes" not in r:
        rec.extra = {**rec.extra, LEGACY: True}
    return rec


def load(path: str) -> dict:
    """A result dict from a saved results.json or from a pytest-benchmark --benchmark-json file
    (whose per-module tests keep the figures in extra_info)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):  # one module's records (e.g. bench_<name>.json of the device check)
        return {"suite": "file", "command": os.path.basename(path), "records": data, "modules": [],
                "limits": {}, "machine": {}, "quick": None}
    if isinstance(data.get("benchmarks"), dict):  # device_check.sh summary.json
        env = data.get("environment") or {}
        gpu = ([{"name": env["gpu"], "capability": env.get("capability", "?"), "sms": env.get("sms", "?"),
                 "memory_gib": env.get("memory_gib", "?")}] if env.get("gpu") else [])
        res = {"suite": "device check", "command": "bash bench/device_check.sh", "started": data.get("started", "?"),
               "device": "cuda" if gpu else "cpu", "quick": None, "limits": {}, "records": [], "modules": [],
               "machine": {"gpus": gpu, "versions": {k: env[k] for k in ("python", "torch", "torch_cuda") if env.get(k)}},
               "elapsed_s": data.get("duration_s"), "sass": data.get("sass")}
        for name, recs in data["benchmarks"].items():
            ok = isinstance(recs, list)
            res["records"] += recs if ok else []
            res["modules"].append({"name": "bench_" + name, "suite": "kernels", "status": "ok" if ok else "error",
                                   "seconds": 0.0, "records": len(recs) if ok else 0, "note": "" if ok else str(recs)})
        return res
    if "benchmarks" in data and "records" not in data:
        res = {"suite": "pytest", "command": "pytest bench/ --benchmark-json=" + os.path.basename(path),
               "started": data.get("datetime", "?"), "modules": [], "records": [], "limits": {},
               "machine": {}, "quick": None}
        for b in data["benchmarks"]:
            ei = b.get("extra_info", {})
            res["records"] += ei.get("records", [])
            res["limits"] = ei.get("limits") or res["limits"]
            res["machine"] = ei.get("machine") or res["machine"]
            res["device"] = ei.get("device", res.get("device", "cpu"))
            res["quick"] = ei.get("quick", res["quick"])
            res["modules"].append({"name": b.get("name"), "suite": ei.get("suite", ""), "status": ei.get("status", "ok"),
                                   "seconds": b.get("stats", {}).get("mean", 0.0), "records": len(ei.get("records", [])),
                                   "note": ei.get("note", "")})
        return res
    return data


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Render a benchmark report from a saved JSON.")
    ap.add_argument("results", help="results.json of a run, or a pytest-benchmark JSON")
    ap.add_argument("--out", default=None, help="output folder (default: next to the JSON)")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    out = a.out or os.path.dirname(os.path.abspath(a.results))
    paths = write_report(load(a.results), out, plots=not a.no_plots)
    print(f"wrote {paths['markdown']}, {paths['json']}" + "".join(f", {p}" for p in paths["plots"]))
    for n in paths["notes"]:
        print("note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
