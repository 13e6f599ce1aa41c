"""The Explorer's view of a runs database: what page.render embeds (its docstring has the shape).

Reads through the optimiser's read API (llmkern.optimize.db) and renames its metrics to the page's
short names, latencies in milliseconds: output_throughput -> throughput, ttft_median -> ttft_p50,
e2e_latency_p95 -> e2e_p95, and so on. Each run also says whether it meets its sweep's constraints
("slo": meets | misses | no SLO) and whether it is the optimiser's pick of its sweep ("best": the most
throughput under the constraints), both decided by the optimiser's own grammar and report code.
"""
from __future__ import annotations

import math
import os
import time
from typing import Dict, List, Optional

from ..optimize import db as runs_db
from ..optimize.grammar import parse_constraints, parse_value
from ..machine_load import is_busy
from ..optimize.report import best

FAMILIES = {"ttft": "ttft", "itl": "itl", "e2e_latency": "e2e"}
STATS = {"mean": "mean", "median": "p50", "p95": "p95", "p99": "p99"}
ESTIMATED = ("throughput", "ttft_p50", "itl_p50", "e2e_p50")
RATES = ("goodput", "request_throughput")  # req/s, shown as they are


class ExploreError(ValueError):
    """A database the Explorer cannot show (missing, not a runs database, or holding no runs)."""


def page_metrics(metrics: Dict[str, Optional[float]]) -> Dict[str, float]:
    """The database's metric names and units (seconds) -> the page's (ms); non-finite values dropped."""
    out = {}
    if _finite(metrics.get("output_throughput")):
        out["throughput"] = float(metrics["output_throughput"])
    for name in RATES:
        if _finite(metrics.get(name)):
            out[name] = float(metrics[name])
    for fam, short in FAMILIES.items():
        for stat, s in STATS.items():
            v = metrics.get(f"{fam}_{stat}")
            if _finite(v):
                out[f"{short}_{s}"] = 1000.0 * float(v)
    return out


def request_latencies(rows: List[dict]) -> Dict[str, List[float]]:
    """Per-request latencies of the requests that completed, sorted, in ms: {"ttft", "e2e", "itl"
    (each request's mean inter-token latency)}; what the comparison's distribution plot draws."""
    out = {"ttft": [], "e2e": [], "itl": []}
    for r in rows:
        if not r.get("ok"):
            continue
        for key, name in (("ttft", "ttft"), ("e2e", "e2e_latency"), ("itl", "itl_mean")):
            if _finite(r.get(name)):
                out[key].append(round(1000.0 * r[name], 3))
    return {k: sorted(v) for k, v in out.items()}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _constraints(spec: Optional[str]) -> Optional[list]:
    """A sweep's constraints; None when it has none or they no longer parse (shown as "no SLO")."""
    try:
        return parse_constraints(spec or "") or None
    except ValueError:
        return None


def machine_label(m: dict) -> str:
    cores = f"{m['cpu_cores']} cores" if m.get("cpu_cores") else "? cores"
    return f"{m.get('cpu_model') or 'unknown CPU'} ({cores}{', ' + m['gpu'] if m.get('gpu') else ', no GPU'})"


def model_label(model: str) -> str:
    """A model path shows as its file or folder name; a plain name as itself."""
    if os.sep in model or model.endswith(".gguf"):
        return os.path.basename(model.rstrip(os.sep)) or model
    return model


def open_readonly(path: str) -> "runs_db.RunsDB":
    """The database at path, read-only, or ExploreError saying what is wrong with it."""
    if not os.path.exists(path):
        raise ExploreError(f"no such file: {path}")
    if os.path.isdir(path):
        raise ExploreError(f"{path} is a folder, not a runs database file")
    try:
        return runs_db.open_db(path, readonly=True)
    except runs_db.SchemaError as e:
        raise ExploreError(str(e)) from None
    except Exception as e:  # sqlite3 errors, permissions
        raise ExploreError(f"cannot read {path}: {e}") from None


def parse_only(items: List[str]) -> Dict[str, str]:
    """`--only KEY=VALUE` terms -> {KEY: VALUE}; ValueError naming a term without '='."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--only: expected KEY=VALUE (model, machine, workload or a knob), got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _matches(run: dict, only: Dict[str, str]) -> bool:
    """run (page shape) has every KEY=VALUE of only: model (name or path), machine (id or label),
    workload (name) or a knob (its value read as the sweep grammar reads it: 8, none, ngram:4)."""
    for key, value in only.items():
        if key == "model":
            ok = value in (run["model"], run["model_path"])
        elif key == "machine":
            ok = value in (run["machine"], run["machine_label"])
        elif key == "workload":
            ok = value == run["workload"]
        else:
            try:
                want = parse_value(value, f"--only {key}")
            except ValueError:
                want = value
            ok = key in run["knobs"] and run["knobs"][key] == want
        if not ok:
            return False
    return True


def load(path: str, allow_empty: bool = False, only: Optional[Dict[str, str]] = None) -> dict:
    """The page data for the database at path (successful results only; with only, those matching
    every KEY=VALUE, see _matches: each sweep's pick is still the pick among all its runs).
    ExploreError when the file is missing, not a runs database, or (unless allow_empty) holds no
    successful result (matching only)."""
    db = open_readonly(path)
    try:
        machines = {str(m["id"]): {"label": machine_label(m), "details": {
            "cpu": m.get("cpu_model"), "cores": m.get("cpu_cores"), "gpu": m.get("gpu"), "memory_gb": m.get("memory_gb"),
            "measured limits": m.get("limits") or {}, "notes": m.get("notes") or ""}} for m in db.machines()}
        workloads = db.workloads()
        sweeps = {s["id"]: s for s in db.sweeps()}
        results = list(db.iter_results(status="ok"))
        requests = {r["id"]: request_latencies(db.latencies(r["id"])) for r in results}
    except Exception as e:
        raise ExploreError(f"cannot read {path}: {e}") from None
    finally:
        db.close()
    if not results and not allow_empty:
        raise ExploreError(f"{path} holds no successful runs yet (fill it with `llmkern optimize`)")
    names = [w["name"] for w in workloads]
    # Two workloads may share a name with different specs: the id tells them apart then.
    wl_label = {w["id"]: w["name"] + (f" #{w['id']}" if names.count(w["name"]) > 1 else "") for w in workloads}
    slo = {sid: _constraints(s.get("constraints")) for sid, s in sweeps.items()}
    # The optimiser's pick per sweep: most throughput among the runs meeting the sweep's constraints.
    best_ids, sweep_rows = set(), []
    for sid, sw in sweeps.items():
        mine = [r for r in results if r["sweep_id"] == sid]
        pick = best(mine, slo[sid] or ()) if slo[sid] else None
        if pick is not None:
            best_ids.add(pick["id"])
        if mine:
            sweep_rows.append({"id": sid, "model": model_label(sw["model"]), "machine": str(sw["machine_id"]),
                               "workload": wl_label.get(sw["workload_id"], "?"), "runs": len(mine),
                               "constraints": ";".join(str(c) for c in slo[sid] or ()),
                               "pick": None if pick is None else str(pick["id"]),
                               "sweep": sw.get("sweep_spec") or "", "notes": sw.get("notes") or ""})
    runs = []
    # Sweeps of other servers (optimize --framework): the framework is a facet like a knob.
    mixed = any((r.get("framework") or "llmkern") != "llmkern" for r in results)
    for r in results:
        if mixed:
            r["knobs"] = dict(framework=r.get("framework") or "llmkern", **r["knobs"])
        cons = slo.get(r["sweep_id"])
        meets = "no SLO" if not cons else ("meets" if all(c.ok(r["metrics"]) for c in cons) else "misses")
        est = page_metrics(r.get("estimate") or {})
        load = r.get("machine_load") or {}
        run = {"id": str(r["id"]), "model": model_label(r["model"]), "machine": str(r["machine_id"]),
               "workload": wl_label.get(r["workload_id"], r.get("workload_name")),
               "workload_kind": r.get("workload_kind"), "knobs": r["knobs"], "metrics": page_metrics(r["metrics"]),
               "estimate": {k: v for k, v in est.items() if k in ESTIMATED}, "command": r.get("serve_command") or "",
               "sweep": r["sweep_id"], "constraints": ";".join(str(c) for c in cons or ()), "slo": meets,
               "best": r["id"] in best_ids, "requests": requests[r["id"]], "llmkern_version": r.get("llmkern_version"),
               "framework_version": r.get("framework_version") or "",
               # other work on the machine during the run (machine_load.py): a filter facet
               "load": _load_label(load), "foreign_cpu": load.get("foreign_cpu"),
               "load_1m": load.get("load_1m_before"),
               "profile_estimates": {name: page_metrics(e) for name, e in (r.get("profile_estimates") or {}).items()}}
        label = machines.get(run["machine"], {}).get("label")
        if not only or _matches(dict(run, model_path=r["model"], machine_label=label), only):
            runs.append(run)
    knobs: List[str] = []
    for r in runs:
        knobs += [k for k in r["knobs"] if k not in knobs]
    if only and not runs and results and not allow_empty:
        every = sorted({k for r in results for k in r["knobs"]})
        raise ExploreError(f"no successful run in {path} matches --only "
                           + " ".join(f"{k}={v}" for k, v in only.items())
                           + f" (models: {', '.join(sorted({model_label(r['model']) for r in results}))}; "
                           f"workloads: {', '.join(sorted(set(wl_label.values())))}; knobs: {', '.join(every)})")
    profiles = sorted({name for r in runs for name in r["profile_estimates"]})
    shown = {r["sweep"] for r in runs}
    sweep_rows = [s for s in sweep_rows if s["id"] in shown]
    return {"title": "llmkern Performance Explorer", "source": os.path.basename(path),
            "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "knobs": knobs,
            "machines": machines, "sweeps": sweep_rows, "runs": runs,
            "estimate_profiles": {name: _profile_label(name) for name in profiles}}


def _load_label(load: dict) -> str:
    if load.get("foreign_cpu") is None:
        return "not recorded"
    return "busy (other work)" if is_busy(load) else "quiet"


def _profile_label(name: str) -> str:
    """How the page names a layer of estimates made for other hardware: never as a measurement."""
    from ..optimize.profiles import DATASHEETS

    how = "datasheet peaks" if name in DATASHEETS else "a saved profile"
    return f"estimate on {name} ({how}; not measured)"
