"""What a sweep prints: best configurations (overall, under the constraints), the Pareto fronts of
throughput against each latency statistic, the estimate-vs-measured error, the serve commands."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .grammar import METRICS, STATS, Constraint
from ..machine_load import is_busy

THROUGHPUT = "output_throughput"
LATENCIES = [f"{m}_{s}" for m in METRICS for s in STATS]


def pareto_front(points: Sequence[dict], x: str = THROUGHPUT, y: str = "ttft_p95") -> List[dict]:
    """The points not dominated by another (x higher is better, y lower is better; a point is
    dominated by one at least as good in both and better in one). Points missing x or y are
    left out. Sorted by x ascending."""
    pts = [p for p in points if p["metrics"].get(x) is not None and p["metrics"].get(y) is not None]
    front = []
    for p in pts:
        px, py = p["metrics"][x], p["metrics"][y]
        if not any(q["metrics"][x] >= px and q["metrics"][y] <= py and (q["metrics"][x] > px or q["metrics"][y] < py)
                   for q in pts):
            front.append(p)
    return sorted(front, key=lambda p: p["metrics"][x])


def best(points: Sequence[dict], constraints: Sequence[Constraint] = ()) -> Optional[dict]:
    """Highest output throughput among the points meeting every constraint (measured)."""
    ok = [p for p in points if p["metrics"].get(THROUGHPUT) is not None and all(c.ok(p["metrics"]) for c in constraints)]
    return max(ok, key=lambda p: p["metrics"][THROUGHPUT]) if ok else None


def rel_errors(points: Sequence[dict], name: str) -> List[float]:
    """|estimate - measured| / measured of one metric over the points that have both, leaving out
    runs taken while other work used the machine (their measurement is not the configuration's)."""
    out = []
    for p in points:
        if is_busy(p.get("machine_load")):
            continue
        m, e = p["metrics"].get(name), p["estimate"].get(name)
        if m and e is not None:
            out.append(abs(e - m) / abs(m))
    return out


def error_table(points: Sequence[dict], names: Sequence[str] = (THROUGHPUT, "itl_median", "ttft_median",
                                                                   "e2e_latency_median")) -> List[dict]:
    from ..engine.metrics import percentile

    rows = []
    for n in names:
        errs = rel_errors(points, n)
        rows.append({"metric": n, "n": len(errs), "median_abs_err": percentile(errs, 50),
                     "p95_abs_err": percentile(errs, 95)})
    return rows


def _fmt(v, name: str) -> str:
    if v is None:
        return "-"
    if name.endswith(("throughput", "goodput")):
        return f"{v:.1f}"
    return f"{v * 1e3:.0f}ms"


def _load(load: Optional[dict]) -> str:
    f = (load or {}).get("foreign_cpu")
    if f is None:
        return "-"
    return f"{100 * f:.0f}%" + (" BUSY" if is_busy(load) else "")


def _knobs(p: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in p["knobs"].items()) or "(defaults)"


def render(points: Sequence[dict], constraints: Sequence[Constraint], fronts: Sequence[str] = ()) -> str:
    cols = [THROUGHPUT, "goodput", "ttft_p95", "itl_median", "itl_p95", "e2e_latency_p95"]
    lines = ["| configuration | " + " | ".join(cols) + " | est. tput | est. itl p50 | meets SLO | other load |",
             "|---|" + "---|" * (len(cols) + 4)]
    for p in points:
        m, e = p["metrics"], p["estimate"]
        meets = "yes" if all(c.ok(m) for c in constraints) else "no"
        lines.append(f"| {_knobs(p)} | " + " | ".join(_fmt(m.get(c), c) for c in cols)
                     + f" | {_fmt(e.get(THROUGHPUT), THROUGHPUT)} | {_fmt(e.get('itl_median'), 'itl')} | {meets} | "
                     + f"{_load(p.get('machine_load'))} |")
    out = ["\n".join(lines), ""]
    b = best(points)
    bc = best(points, constraints) if constraints else None
    if b:
        out.append(f"best overall: {_knobs(b)} ({b['metrics'][THROUGHPUT]:.1f} tok/s)\n    {b['serve_command']}")
    if constraints:
        slo = ";".join(str(c) for c in constraints)
        if bc:
            out.append(f"best under {slo}: {_knobs(bc)} ({bc['metrics'][THROUGHPUT]:.1f} tok/s)\n"
                       f"    {bc['serve_command']}")
        else:
            out.append(f"no configuration meets {slo}")
    for y in fronts or [f"{m}_p95" for m in METRICS]:
        f = pareto_front(points, THROUGHPUT, y)
        out.append(f"Pareto front, {THROUGHPUT} vs {y}:")
        for p in f:
            out.append(f"    {p['metrics'][THROUGHPUT]:8.1f} tok/s  {_fmt(p['metrics'][y], y):>8}  {_knobs(p)}\n"
                       f"        {p['serve_command']}")
    errs = error_table(points)
    busy = sum(1 for p in points if is_busy(p.get("machine_load")))
    out.append("estimate vs measured (|est - meas| / meas" + (f"; {busy} runs on a busy machine left out" if busy
                                                              else "") + "):")
    for r in errs:
        if r["n"]:
            out.append(f"    {r['metric']:<20} median {100 * r['median_abs_err']:.0f}%  p95 {100 * r['p95_abs_err']:.0f}%"
                       f"  over {r['n']} configurations")
    return "\n".join(out)
