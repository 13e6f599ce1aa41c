"""The benchmark report's plots (matplotlib, optional: `pip install "llmkern[bench]"`): latency vs
sequence length for attention, GB/s vs batch for paged decode and for sampling, tok/s vs request
count for end-to-end runs; each record's x value read from its axes. A plot whose data is missing
is skipped with a note in the report."""
from __future__ import annotations

import math
import os
import re
from typing import Optional

from .common import Record

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
