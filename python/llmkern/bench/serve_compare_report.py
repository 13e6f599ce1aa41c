"""The report of `llmkern bench serve --peer ...`: the rows of every round merged per (dtype,
workload, rate, client, system) (the range over rounds shown, the median used for ratios), ratio
rows llmkern / peer, the Markdown table per dtype and the latency-vs-rate plots."""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Tuple

# (row key, column title, scale to the shown unit)
METRICS: Tuple[Tuple[str, str, float], ...] = (
    ("ttft_p50", "TTFT p50 (ms)", 1e3), ("ttft_p99", "TTFT p99 (ms)", 1e3), ("tpot_p50", "TPOT p50 (ms)", 1e3),
    ("tpot_p99", "TPOT p99 (ms)", 1e3), ("out_tok_s", "out tok/s", 1.0), ("goodput_rps", "goodput (req/s)", 1.0),
    ("load_1m", "load 1m", 1.0))
GROUP = ("dtype", "workload", "rate", "client", "system")
OURS = "llmkern"


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def merge(rows: List[dict]) -> List[dict]:
    """One entry per (dtype, workload, rate, client, system), in first-seen order: for each metric
    the values of every round (None dropped) as {"lo", "median", "hi", "n"}."""
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in GROUP), []).append(r)
    out = []
    for key, rs in groups.items():
        m = dict(zip(GROUP, key))
        for name, _, _ in METRICS:
            vals = [r[name] for r in rs if r.get(name) is not None]
            m[name] = ({"lo": min(vals), "median": statistics.median(vals), "hi": max(vals), "n": len(vals)}
                       if vals else None)
        m["completed"] = sum(r.get("completed", 0) for r in rs)
        m["requests"] = sum(r.get("requests", 0) for r in rs)
        out.append(m)
    return out


def ratios(merged: List[dict]) -> List[dict]:
    """llmkern / peer of the medians, per (dtype, workload, rate, client) and peer: < 1 is better
    for llmkern on the latencies, > 1 on throughput and goodput."""
    ours = {tuple(m[k] for k in GROUP[:4]): m for m in merged if m["system"] == OURS}
    out = []
    for m in merged:
        o = ours.get(tuple(m[k] for k in GROUP[:4]))
        if m["system"] == OURS or o is None:
            continue
        r = {k: m[k] for k in GROUP[:4]}
        r["system"] = f"{OURS} / {m['system']}"
        for name, _, _ in METRICS[:-1]:
            a, b = o.get(name), m.get(name)
            r[name] = round(a["median"] / b["median"], 3) if a and b and b["median"] else None
        out.append(r)
    return out


def _cell(v: Optional[dict], scale: float) -> str:
    if v is None:
        return "-"
    lo, hi = v["lo"] * scale, v["hi"] * scale
    def fmt(x: float) -> str:
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def table(merged: List[dict], dtype: str) -> str:
    """The Markdown table of one dtype: the systems' rows (ranges over rounds), then the ratio rows."""
    cols = ["workload", "rate", "client", "system", "done"] + [t for _, t, _ in METRICS]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    ms = [m for m in merged if m["dtype"] == dtype]
    for m in ms:
        cells = [m["workload"], rate_label(m["rate"]), m["client"], m["system"], f"{m['completed']}/{m['requests']}"]
        lines.append("| " + " | ".join(cells + [_cell(m[k], s) for k, _, s in METRICS]) + " |")
    for r in ratios(ms):
        cells = [r["workload"], rate_label(r["rate"]), r["client"], f"**{r['system']}**", ""]
        lines.append("| " + " | ".join(cells + ["-" if r.get(k) is None else f"{r[k]:.2f}×" for k, _, _ in METRICS[:-1]]
                                       + [""]) + " |")
    return "\n".join(lines)


def plot(merged: List[dict], dtype: str, path: str) -> Optional[str]:
    """TTFT p50, TTFT p99, TPOT p50 and goodput vs rate, one row of panels per workload, one line per
    system (and client); rate inf drawn right of the largest rate. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ms = [m for m in merged if m["dtype"] == dtype]
    workloads = list(dict.fromkeys(m["workload"] for m in ms))
    if not ms:
        return None
    finite = [m["rate"] for m in ms if not math.isinf(m["rate"])]
    inf_x = (max(finite) + 1.0) if finite else 1.0
    ticks = sorted({inf_x if math.isinf(m["rate"]) else m["rate"] for m in ms})
    labels = ["inf" if (x == inf_x and any(math.isinf(m["rate"]) for m in ms)) else f"{x:g}" for x in ticks]
    keys = (("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"), ("tpot_p50", "TPOT p50 (s)"),
            ("goodput_rps", "goodput (req/s)"))
    fig, axes = plt.subplots(len(workloads), len(keys), figsize=(5 * len(keys), 3.8 * len(workloads)), squeeze=False)
    for wi, w in enumerate(workloads):
        series = list(dict.fromkeys((m["system"], m["client"]) for m in ms if m["workload"] == w))
        for system, client in series:
            pts = sorted((m for m in ms if (m["workload"], m["system"], m["client"]) == (w, system, client)),
                         key=lambda m: m["rate"])
            xs = [inf_x if math.isinf(m["rate"]) else m["rate"] for m in pts]
            for ax, (k, title) in zip(axes[wi], keys):
                ax.plot(xs, [m[k]["median"] if m[k] else float("nan") for m in pts], marker="o",
                        label=f"{system} ({client} client)")
                ax.set_title(f"{w}: {title}")
                ax.set_xticks(ticks, labels)
                ax.set_xlabel("request rate (req/s)")
        axes[wi][0].legend(fontsize=8)
    fig.suptitle(f"llmkern bench serve, {dtype}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
