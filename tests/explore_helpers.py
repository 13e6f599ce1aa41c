"""Helpers for the Explorer tests: a synthetic runs database written through the optimiser's
database API, and what the page must show for it, computed from the file with plain SQL (not
through llmkern.explore) and a brute-force Pareto front."""
from __future__ import annotations

import json
import random
import re
import sqlite3
from typing import Dict, List, Optional, Sequence

KNOBS = {"max_num_seqs": [8, 32, 128], "max_num_batched_tokens": [256, 1024], "speculative": [None, "ngram:4"]}
# page plot id -> database metric (x) it plots against output_throughput, or the estimated metric.
PARETO = {"pareto-ttft": "ttft", "pareto-itl": "itl", "pareto-e2e": "e2e_latency"}
ESTIMATE = {"estimate-throughput": "output_throughput", "estimate-itl_p50": "itl_median",
            "estimate-ttft_p50": "ttft_median", "estimate-e2e_p50": "e2e_latency_median"}


def read_slo(spec: str) -> List[tuple]:
    """A sweep's constraints ("ttft:p95<500ms;itl:p95<0.3s") read by hand: [(db metric, op, limit in s)]."""
    out = []
    for term in filter(None, (t.strip() for t in (spec or "").split(";"))):
        m = re.fullmatch(r"(ttft|itl|e2e_latency):(mean|median|p95|p99)(<=|<)([0-9.]+)(ms|s)?", term)
        assert m, f"test helper cannot read constraint {term!r}"
        out.append((f"{m[1]}_{m[2]}", m[3], float(m[4]) * (1.0 if m[5] == "s" else 1e-3)))
    return out


def meets(measured: dict, slo: List[tuple]) -> bool:
    return bool(slo) and all(name in measured and (measured[name] < lim if op == "<" else measured[name] <= lim)
                             for name, op, lim in slo)
STAT_NAMES = {"p50": "median", "mean": "mean", "p95": "p95", "p99": "p99"}


def _serve_metrics(rng: random.Random) -> Dict[str, float]:
    m = {"output_throughput": rng.uniform(20, 400), "request_throughput": rng.uniform(0.1, 4)}
    for fam, lo, hi in (("ttft", 0.02, 0.9), ("itl", 0.005, 0.08), ("e2e_latency", 0.5, 6.0)):
        base = rng.uniform(lo, hi)
        m.update({f"{fam}_median": base, f"{fam}_mean": base * rng.uniform(1.0, 1.3),
                  f"{fam}_p95": base * rng.uniform(1.3, 2.0), f"{fam}_p99": base * rng.uniform(2.0, 3.0)})
    return m


def build_db(path: str, seed: int = 0) -> str:
    """Two machines, two models, a serve workload (chat) and an offline one (throughput only), the
    full KNOBS grid on the first model, a few failed results and results without an estimate."""
    from llmkern.optimize import db as runs_db

    rng = random.Random(seed)
    with runs_db.open_db(path) as db:
        cpu = db.add_machine("Test CPU 2-core", 2, None, 8.0, {"bandwidth_gbs": 10.0}, notes="synthetic")
        gpu = db.add_machine("Test CPU 16-core", 16, "Test GPU 80GB", 128.0, {"bandwidth_gbs": 3000.0})
        chat = db.add_workload("chat", "serve", {"requests": 16, "rate": 2.0}, 16)
        offline = db.add_workload("offline", "offline", {"requests": 32}, 32)
        grid = [dict(max_num_seqs=s, max_num_batched_tokens=t, speculative=sp)
                for s in KNOBS["max_num_seqs"] for t in KNOBS["max_num_batched_tokens"] for sp in KNOBS["speculative"]]
        plan = [("SmolLM2-135M-Instruct", cpu, chat, grid, "ttft:p95<500ms"),
                ("SmolLM2-135M-Instruct", gpu, chat, grid[:6], "ttft:p95<500ms"),
                ("/models/tiny-llama", cpu, chat, grid[:5], "itl:p95<50ms;ttft:p95<800ms"),
                ("SmolLM2-135M-Instruct", cpu, offline, grid[:4], "")]
        n = 0
        for model, machine, workload, configs, slo in plan:
            sweep = db.start_sweep(model, machine, workload, "0.1.0", sweep_spec="synthetic", constraints=slo)
            for knobs in configs:
                n += 1
                cmd = "llmkern serve --max-num-seqs {max_num_seqs} --max-num-batched-tokens {max_num_batched_tokens}".format(**knobs)
                cmd += f" --speculative {knobs['speculative']}" if knobs["speculative"] else ""
                if n % 7 == 3:   # a failed configuration: not shown in the plots
                    db.record_result(sweep, knobs, "failed", {}, error="server did not start", serve_command=cmd)
                    continue
                m = _serve_metrics(rng)
                if workload == offline:   # offline runs measure throughput only
                    m = {"output_throughput": m["output_throughput"]}
                est = None if n % 5 == 0 else {"output_throughput": m["output_throughput"] * rng.uniform(0.7, 1.3),
                                               "itl_median": m.get("itl_median", 0.01) * rng.uniform(0.7, 1.3),
                                               "e2e_latency_median": m.get("e2e_latency_median", 1.0) * rng.uniform(0.7, 1.3),
                                               "decode_step_time": 0.01}
                # 1-4 requests; every fifth failed, some without a mean ITL (one output token)
                lat = [{"ok": i % 5 != 4, "ttft": rng.uniform(0.05, 1.0), "e2e_latency": rng.uniform(0.5, 5.0),
                        "itl_mean": None if i == 2 else rng.uniform(0.005, 0.05), "output_tokens": 10,
                        "prompt_tokens": 5, "itls": [0.01] * 9} for i in range(n % 4 + 1 + (n % 3 == 0) * 3)]
                # the load over the run: quiet, busy (other work), or not recorded (older databases)
                load = [{"foreign_cpu": 0.05, "load_1m_before": 0.3}, {"foreign_cpu": 0.6, "load_1m_before": 2.5},
                        None][n % 3]
                # estimates on other hardware (optimize --estimate-profile): medians only
                prof = None if est is None or workload == offline else {"H100": {
                    "output_throughput": m["output_throughput"] * 9, "ttft_median": m["ttft_median"] / 20,
                    "itl_median": m["itl_median"] / 10, "e2e_latency_median": m["e2e_latency_median"] / 10}}
                db.record_result(sweep, knobs, "ok", m, estimate=est, serve_command=cmd, latencies=lat,
                                 machine_load=load, profile_estimates=prof)
            db.finish_sweep(sweep)
    return path


def build_empty_db(path: str) -> str:
    from llmkern.optimize import db as runs_db

    with runs_db.open_db(path):
        pass
    return path


# ---- what the page must show, straight from the file ---------------------------------------------
def ok_results(path: str, where: Optional[Dict[str, List]] = None) -> List[dict]:
    """Successful results as {id, sweep_id, model, machine_id, workload, knobs, measured: {}, estimate: {},
    meets (its sweep's constraints), best (its sweep's pick: most output throughput among the runs
    meeting the constraints)}; where: {"workload": [names], "model": [model strings], "machine_id": [ids],
    "knob.NAME": [values]} keeps the results matching any value of each list."""
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    rows = con.execute("SELECT r.id, r.serve_command, r.sweep_id, s.constraints, s.model, s.machine_id, "
                       "w.name AS workload, w.id AS workload_id, c.knobs_json "
                       "FROM results r JOIN sweeps s ON s.id = r.sweep_id JOIN workloads w ON w.id = s.workload_id "
                       "JOIN configurations c ON c.id = r.config_id WHERE r.status = 'ok' ORDER BY r.id").fetchall()
    out = []
    for r in rows:
        d = dict(r)
        d["knobs"] = json.loads(d.pop("knobs_json"))
        d["measured"], d["estimate"], d["load"], d["layers"] = {}, {}, {}, {}
        for m in con.execute("SELECT source, name, value FROM metrics WHERE result_id = ?", (r["id"],)):
            if m["value"] is None:
                continue
            src = m["source"]
            if src.startswith("estimate:"):
                d["layers"].setdefault(src.split(":", 1)[1], {})[m["name"]] = m["value"]
            else:
                d[{"measured": "measured", "estimate": "estimate", "machine": "load"}[src]][m["name"]] = m["value"]
        f = d["load"].get("foreign_cpu")
        d["load"] = "not recorded" if f is None else ("busy (other work)" if f > 0.25 else "quiet")
        d["requests"] = {key: con.execute(f"SELECT count(*) FROM latencies WHERE result_id = ? AND ok = 1 "
                                          f"AND {col} IS NOT NULL", (r["id"],)).fetchone()[0]
                         for key, col in (("ttft", "ttft"), ("e2e", "e2e_latency"), ("itl", "itl_mean"))}
        d["meets"] = meets(d["measured"], read_slo(d["constraints"]))
        out.append(d)
    con.close()
    for d in out:
        mates = [x["measured"]["output_throughput"] for x in out if x["sweep_id"] == d["sweep_id"] and x["meets"]]
        d["best"] = d["meets"] and d["measured"]["output_throughput"] == max(mates)

    def keep(d):
        return all((d["knobs"].get(k[5:]) if k.startswith("knob.") else d[k]) in allowed
                   for k, allowed in (where or {}).items())

    return [d for d in out if keep(d)]


def pareto_size(points: List[tuple]) -> int:
    """Points (latency, throughput) not dominated by another: one with throughput >= and
    latency <=, better in at least one (brute force)."""
    def dominated(p):
        return any(q[0] <= p[0] and q[1] >= p[1] and (q[0] < p[0] or q[1] > p[1]) for q in points)

    return sum(not dominated(p) for p in points)


def expected_counts(results: List[dict], stat: str = "p50", layers: Sequence[str] = ()) -> Dict[str, dict]:
    """Per plot id: {"points": n, "pareto": n, "best": n, "estimated": n} the page must hold for
    these results (estimated: points of the layered estimates for other hardware)."""
    out = {}
    for plot, fam in PARETO.items():
        name = f"{fam}_{STAT_NAMES[stat]}"
        pts = [r for r in results if name in r["measured"] and "output_throughput" in r["measured"]]
        groups: Dict[tuple, list] = {}
        for r in pts:
            # the page's groups: two workloads with one name (e.g. an offline batch run in-process and
            # one sent through another framework's server) are two groups
            groups.setdefault((r["model"], r["machine_id"], r["workload_id"]), []).append(
                (r["measured"][name], r["measured"]["output_throughput"]))
        est = sum(name in r["layers"].get(p, {}) and "output_throughput" in r["layers"].get(p, {})
                  for r in results for p in layers)
        out[plot] = {"points": len(pts), "pareto": sum(pareto_size(g) for g in groups.values()),
                     "best": sum(r["best"] for r in pts), "estimated": est}
    for plot, name in ESTIMATE.items():
        out[plot] = {"points": sum(name in r["measured"] and name in r["estimate"] for r in results), "pareto": 0,
                     "best": 0}
    return out
