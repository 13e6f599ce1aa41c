"""Benchmark report: JSON of all figures, a Markdown report and PNG plots.

    python -m llmkern.bench.report RESULTS.json [--out DIR]    # re-render a saved run
                                                       # (or a pytest-benchmark --benchmark-json file)

Plots (matplotlib, optional: `pip install "llmkern[bench]"`): latency vs sequence length for
attention, GB/s vs batch for paged decode and for sampling, tok/s vs request count for
end-to-end runs. A plot whose data is missing is skipped with a note in the report.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))

from llmkern.bench.common import Record, fmt_seconds  # noqa: E402

MATPLOTLIB_NOTE = ("matplotlib is not installed, so no plots were drawn "
                   "(install it with `pip install \"llmkern[bench]\"` or `pip install matplotlib`).")

# ---- x values of records -----------------------------------------------------------------------
# Records carry their plot coordinates in Record.axes (common.Axes). Results saved before that
# field existed have none; load() marks their records LEGACY and only those are placed by the old
# guesses below: (pattern with group v = the value, what replaces the match in the series label).
# A "k" suffix means x1024 (LLM sizes: 2k = 2048 tokens).
LEGACY = "legacy_case_axes"
_NUM = r"(?P<v>\d+(?:\.\d+)?[kKmM]?)"
_AXIS_PATTERNS = {
    "seqlen": [
        (rf"(?<![A-Za-z])(?:seqlen|seq_len|seq|sk|sq|ctx|context|len|s)\s*[=:]?\s*{_NUM}(?![\w.])", None),
        (rf"(?<![\w./])(?P<b>\d+)\s*[x\u00d7]\s*{_NUM}(?![\w./])", lambda m: f"b{m['b']}"),
        (rf"(?<![\d.]){_NUM}\s*[-_ ]?(?:ctx|context|tokens|tok|seqlen)\b", None),
    ],
    "batch": [
        (rf"(?<![A-Za-z])(?:batch|bsz|b|rows|seqs|reqs)\s*[=:]?\s*{_NUM}(?![\w.])", None),
        (rf"(?<![\d.]){_NUM}\s*[-_ ]?(?:rows|seqs|sequences|batch|reqs)\b", None),
        (rf"(?<![\w./]){_NUM}\s*[x\u00d7]\s*(?=\d)", None),
    ],
    "requests": [
        (rf"(?<![\d.]){_NUM}\s*[-_ ]?(?:requests|request|reqs|req|prompts)\b", None),
        (rf"(?<![A-Za-z])(?P<k>requests|reqs|req|offline|n)\s*[-=:_]?\s*{_NUM}(?![\w.])",
         lambda m: m["k"] if m["k"].lower() == "offline" else ""),
    ],
}
_EDGE = {"x", "\u00d7", "-", ",", ";", "/", "over", "at", "with"}


def _num(s: str) -> float:
    mult = {"k": 1024, "m": 1024 * 1024}.get(s[-1].lower(), 1)
    return float(s.rstrip("kKmM")) * mult


def _label(text: str) -> str:
    toks = text.replace(",", " , ").split()
    while toks and toks[0].lower() in _EDGE:
        toks.pop(0)
    while toks and toks[-1].lower() in _EDGE:
        toks.pop()
    return " ".join(toks).replace(" , ", ", ")


def axis_value(r: Record, axis: str) -> tuple:
    """(x, series label, panel) of record r on axis from r.axes, or (None, None, None) when the
    record does not say (a record of an old results file: guessed from its case, see LEGACY)."""
    if axis in r.axes:
        return float(r.axes[axis]), r.axes.get("series", r.case), r.axes.get("panel", r.bench)
    if r.extra.get(LEGACY):
        return _legacy_axis_value(r, axis)
    return None, None, None


def _legacy_axis_value(r: Record, axis: str) -> tuple:
    """The guess for records saved without axes: extra[axis] or a number in the case string; the
    panel is the benchmark name, without the x value when it holds it ("e2e/offline-32")."""
    series = r.extra.get("series")
    given = r.extra.get(axis)
    for pat, keep in _AXIS_PATTERNS[axis]:
        m = re.search(pat, r.case, re.I)
        if m and (given is None or _num(m.group("v")) == float(given)):
            rest = r.case[:m.start()] + " " + (keep(m) if keep else "") + " " + r.case[m.end():]
            return _num(m.group("v")), series or _label(rest) or r.bench.split("/")[-1], r.bench
    if given is not None:  # the case string shows the value some other way: drop it from the label
        v = float(given)
        rest = re.sub(rf"(?<![\w.]){int(v) if v == int(v) else v}(?![\w.])", " ", r.case) if v >= 0 else r.case
        return v, series or _label(rest) or r.bench.split("/")[-1], r.bench
    family, _, name = r.bench.rpartition("/")
    for pat, keep in _AXIS_PATTERNS[axis]:
        m = re.search(pat, name, re.I)
        if m:  # the case then describes the comparison (peer), not a curve: one curve per panel
            rest = name[:m.start()] + " " + (keep(m) if keep else "") + " " + name[m.end():]
            panel = (family + "/" if family else "") + _label(rest)
            return _num(m.group("v")), series or "", panel.rstrip("/-_ ")
    return None, None, None


def _tick(x: float) -> str:
    if x >= 1024 and x % 1024 == 0:
        return f"{int(x) // 1024}k"
    return f"{x:g}"


# ---- plots ---------------------------------------------------------------------------------------
def _is_decode(r: Record) -> bool:
    return "decode" in r.bench or "kvcache" in r.bench.split("/")[-1]


PLOTS = [
    {"file": "attention_latency.png", "title": "Attention: latency vs sequence length",
     "select": lambda r: r.bench.startswith("attention") and not _is_decode(r),
     "x": "seqlen", "xlabel": "sequence length (tokens, log scale)", "y": "time",
     "ylabel": "latency per call (ms"},
    {"file": "decode_bandwidth.png", "title": "Paged decode: KV-cache read bandwidth vs batch",
     "select": lambda r: r.bench.startswith("attention") and _is_decode(r),
     "x": "batch", "xlabel": "batch (sequences, log scale)", "y": "GB/s",
     "ylabel": "achieved bandwidth (GB/s"},
    {"file": "sampling_bandwidth.png", "title": "Sampling: bandwidth vs batch",
     "select": lambda r: r.bench.startswith("sampling"),
     "x": "batch", "xlabel": "batch (rows, log scale)", "y": "GB/s",
     "ylabel": "logits / probabilities read (GB/s"},
    {"file": "e2e_throughput.png", "title": "End-to-end: output throughput vs request count",
     "select": lambda r: r.bench.startswith("e2e") or r.metric.endswith("tok/s"),
     "x": "requests", "xlabel": "requests (log scale)", "y": "tok/s",
     "ylabel": "output throughput (tokens/s"},
]


def _series(spec: dict, records: list) -> tuple:
    """({(bench, series): {"llmkern": {x: y}, "peers": {peer name: {x: y}}}}, note) for a plot;
    the note says why nothing (or not everything) could be drawn."""
    picked = [r for r in records if spec["select"](r)]
    if not picked:
        return {}, "no records for it in this run"
    if spec["y"] != "time":  # "out tok/s" counts as tok/s
        picked = [r for r in picked if r.llmkern_value is not None
                  and (r.metric == spec["y"] or r.metric.endswith(" " + spec["y"]))]
        if not picked:
            return {}, f"no records report {spec['y']}"
    out: dict = {}
    left_out = 0
    for r in picked:
        x, label, panel = axis_value(r, spec["x"])
        if x is None:
            left_out += 1
            continue
        if spec["y"] == "time":
            y, yp = r.llmkern_s * 1e3, (r.peer_s * 1e3 if r.peer_s else None)
        else:
            y, yp = r.llmkern_value, r.peer_value
        curve = out.setdefault((panel, label), {"llmkern": {}, "peers": {}})
        curve["llmkern"].setdefault(x, y)  # several peers may share one llmkern measurement
        if yp is not None:
            curve["peers"].setdefault(r.peer, {})[x] = yp
    if not out:
        return {}, f"no record says its {spec['x']} (set Record.axes[{spec['x']!r}])"
    return out, (f"{left_out} of {len(picked)} records left out (no {spec['x']!r} in their Record.axes)"
                 if left_out else "")


def draw_plots(records: list, out_dir: str, limits: Optional[dict] = None) -> tuple:
    """Write the PNGs; returns ([(title, file name)], [notes about skipped plots])."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        return [], [MATPLOTLIB_NOTE]
    made, notes = [], []
    limits = limits or {}
    for spec in PLOTS:
        data, note = _series(spec, records)
        if not data:
            notes.append(f"{spec['title']}: skipped, {note}.")
            continue
        if note:
            notes.append(f"{spec['title']}: {note}.")
        # one panel per benchmark (e.g. per sampling filter), curves per case family inside
        benches = sorted({b for b, _ in data})
        cols = 1 if len(benches) == 1 else (2 if len(benches) <= 4 else 3)
        rows = math.ceil(len(benches) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols + 1.5 * (cols == 1), 5.2 * rows), dpi=100, squeeze=False)
        for ax, bench in zip(axes.flat, benches):
            _panel(ax, plt, ticker, spec, {k[1]: v for k, v in data.items() if k[0] == bench}, limits, bench)
        for ax in list(axes.flat)[len(benches):]:
            ax.set_visible(False)
        fig.suptitle(spec["title"] + "\nllmkern vs peers measured in the same run "
                     "(curves: llmkern solid, peers dashed / dotted; bars: llmkern blue)", fontsize=12)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, spec["file"]), bbox_inches="tight")
        plt.close(fig)
        made.append((spec["title"], spec["file"]))
    if _draw_speedups(plt, ticker, records, out_dir):
        made.insert(0, ("Speed-up over the peer (headline cases)", SPEEDUP_FILE))
    return made, notes


def _panel(ax, plt, ticker, spec: dict, curves: dict, limits: dict, bench: str) -> None:
    """Curves {label: {"llmkern": {x: y}, "peers": {name: {x: y}}}} of one benchmark: lines,
    or horizontal bars when no curve has two points (a --quick run measures one size)."""
    ys = [y for cv in curves.values() for d in [cv["llmkern"], *cv["peers"].values()] for y in d.values() if y]
    log = spec["y"] == "time" or (ys and max(ys) > 20 * min(ys))  # peers 10x apart stay readable
    bars = all(len(cv["llmkern"]) < 2 for cv in curves.values())
    if bars:
        _bars(ax, spec, curves)
    else:
        _lines(ax, plt, spec, curves)
    value_axis = ax.xaxis if bars else ax.yaxis
    if spec["y"] == "GB/s" and limits.get("read_bandwidth_Bps"):
        (ax.axvline if bars else ax.axhline)(limits["read_bandwidth_Bps"] / 1e9, color="gray", ls=":", lw=1.5,
                                             label=f"measured read bandwidth {limits['read_bandwidth_Bps'] / 1e9:.1f} GB/s")
    label = spec["ylabel"]
    if log:
        (ax.set_xscale if bars else ax.set_yscale)("log")
        decades = math.log10(max(ys) / min(ys)) if ys else 1
        subs = (1.0, 2.0, 5.0) if decades <= 2 else (1.0, 3.0) if decades <= 3.5 else (1.0,)
        value_axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
        value_axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        value_axis.set_minor_formatter(ticker.NullFormatter())
        label += ", log scale"
    elif bars:
        ax.set_xlim(left=0)
    else:
        ax.set_ylim(bottom=0)
    value_axis.set_label_text(label + ")")
    ax.set_title(bench, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)


def _lines(ax, plt, spec: dict, curves: dict) -> None:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, curve) in enumerate(sorted(curves.items())):
        c = colors[i % len(colors)]
        pts = sorted(curve["llmkern"].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=c, label=f"llmkern {label}")
        for j, (peer, vals) in enumerate(sorted(curve["peers"].items())):
            pts = sorted(vals.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ("--", ":", "-.")[j % 3] + "sD^v"[j % 4],
                    color=c, alpha=0.75, markerfacecolor="none", label=f"{peer} {label}")
    xs = sorted({x for cv in curves.values() for x in cv["llmkern"]})
    ax.set_xscale("log", base=2)
    if len(xs) <= 12:
        ax.set_xticks(xs, [_tick(x) for x in xs])
        ax.minorticks_off()
    ax.set_xlabel(spec["xlabel"])


def _bars(ax, spec: dict, curves: dict) -> None:
    """Grouped horizontal bars: one group per (curve, x), llmkern and each peer side by side."""
    axis_name = spec["xlabel"].split(" (")[0]
    groups = []  # (group label, [(series name, value)])
    for label, curve in sorted(curves.items(), key=lambda kv: (min(kv[1]["llmkern"]), kv[0])):
        for x, y in sorted(curve["llmkern"].items()):
            bars = [("llmkern", y)] + [(p, v[x]) for p, v in sorted(curve["peers"].items()) if x in v]
            groups.append((f"{label}\n{axis_name} {_tick(x)}".strip(), bars))
    names = ["llmkern"] + sorted({n for _, bars in groups for n, _ in bars} - {"llmkern"})
    palette = ["tab:blue", "tab:gray", "tab:orange", "tab:olive", "tab:brown", "tab:purple"]
    colors = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    h = 0.8 / max(len(bars) for _, bars in groups)
    centers = list(range(len(groups)))[::-1]
    placed: dict = {}  # name -> [(y, value)]: bars of each group centred on the group's tick
    for yc, (_, bars) in zip(centers, groups):
        top = yc + h * len(bars) / 2
        for k, (n, v) in enumerate(bars):
            placed.setdefault(n, []).append((top - h * (k + 0.5), v))
    for n in names:
        pts = placed.get(n, [])
        if pts:
            ax.barh([p[0] for p in pts], [p[1] for p in pts], height=h * 0.95, color=colors[n], label=n)
    ax.set_yticks(centers, [g[0] for g in groups], fontsize=7)


SPEEDUP_FILE = "speedup.png"


def _draw_speedups(plt, ticker, records: list, out_dir: str) -> bool:
    """Horizontal bars: ratio (peer time / llmkern time) of each headline case, log scale."""
    heads = [r for r in headline_records(records) if r.ratio]
    if not heads:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(heads) + 1.6), dpi=110)
    labels = [f"{r.bench} vs {r.peer}\n{r.case}" for r in heads]
    ratios = [r.ratio for r in heads]
    ys = list(range(len(heads)))[::-1]
    ax.barh(ys, ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    for y, x in zip(ys, ratios):
        ax.text(x, y, f" {x:.2f}x", va="center", fontsize=8)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("speed-up: peer time / llmkern time (log scale, > 1 = llmkern faster)")
    ax.set_title("llmkern vs peers, same run", fontsize=11)
    ax.set_xlim(min(0.5, min(ratios) / 1.5), max(2.0, max(ratios) * 3))
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, SPEEDUP_FILE))
    plt.close(fig)
    return True


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
HEADLINE_CASES = [
    ("attention/prefill", r"bfloat16 1x2048 llama|bf16.*\b1x2048\b.*32/8"),
    ("attention/paged decode", r"bfloat16 64x1024|bf16.*\b64x1024\b"),
    ("attention/paged prefill", r"bfloat16|bf16"),
    ("sampling/", r"\b64 ?x ?49152\b"),
]


def headline_records(records: list) -> list:
    """One record per benchmark and peer: the case marked extra["headline"], else the one
    HEADLINE_CASES names, else the last."""
    by_bench: dict = {}
    for r in records:
        by_bench.setdefault((r.bench, r.peer), []).append(r)
    out = []
    for (bench, _), recs in by_bench.items():
        pick = [r for r in recs if r.extra.get("headline")]
        for prefix, pat in HEADLINE_CASES:
            if not pick and bench.startswith(prefix):
                pick = [r for r in recs if re.search(pat, r.case)]
        out.append(pick[0] if pick else recs[-1])
    return out


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
        rows.append([f"Measured read bandwidth ({lim.get('device')})", _gb(lim.get("read_bandwidth_Bps")) + " (torch sum over 256 MiB, best batch)"])
        mm = [f"{k.split('_')[1]} {v / 1e9:,.0f} GFLOP/s" for k, v in lim.items() if k.startswith("matmul_")]
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


EXPLORER_PNG = "explorer.png"


def explorer_section(out_dir: str, db_path: Optional[str]) -> list:
    """Markdown lines showing a screenshot of the Performance Explorer over the runs database
    db_path (taken with headless Chromium into out_dir), or a note saying why there is none."""
    if not db_path:
        return []
    lines = ["", "## Performance Explorer", ""]
    try:
        from llmkern.explore.cli import screenshot_db

        n = screenshot_db(db_path, os.path.join(out_dir, EXPLORER_PNG))
    except Exception as e:  # no Chromium, no plotly, an unreadable database: the report still renders
        return lines + [f"- no screenshot of the explorer over `{os.path.basename(db_path)}`: {e}"]
    return lines + [f"`llmkern explore --db {os.path.basename(db_path)}`: {n} optimiser runs "
                    "(Pareto fronts, estimate vs measured, compared configurations).", "",
                    f"![Performance Explorer]({EXPLORER_PNG})"]


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


def write_report(res: dict, out_dir: str, plots: bool = True, explorer_db: Optional[str] = None) -> dict:
    """Write results.json, report.md and the plots into out_dir; returns their paths. explorer_db:
    a runs database whose Performance Explorer page is screenshotted into the report (with plots)."""
    os.makedirs(out_dir, exist_ok=True)
    records = [as_record(r) for r in res.get("records", [])]
    made, notes = draw_plots(records, out_dir, res.get("limits")) if plots else ([], ["plots disabled (--no-plots)."])
    explorer = explorer_section(out_dir, explorer_db) if plots else []
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "report.md")}
    with open(paths["json"], "w") as f:
        json.dump(to_json(res, records), f, indent=1, default=str)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(res, records, made, notes, explorer))
    paths["plots"] = [os.path.join(out_dir, fn) for _, fn in made]
    if any(EXPLORER_PNG in line for line in explorer):
        paths["plots"].append(os.path.join(out_dir, EXPLORER_PNG))
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
