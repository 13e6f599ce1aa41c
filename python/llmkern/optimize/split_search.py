"""`llmkern estimate --num-gpus N`: every tensor/pipeline/data split of N devices that llmkern can
run for the model, estimated at the workload, and the pick under the SLO: the highest output
throughput among the splits that meet every constraint (ties: the smaller tp, less communication);
when none meets them, none is picked and the closest (smallest worst ratio to its limit) is named."""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Sequence

from .estimate import EngineKnobs, ModelShape, concurrency_estimate
from .grammar import Constraint
from .parallel import splits
from .profiles import HardwareProfile

METRICS = ("ttft_median", "ttft_p95", "itl_median", "itl_p95", "output_throughput", "request_throughput")


def _worst_ratio(row: dict, constraints: Sequence[Constraint]) -> float:
    return max((row[c.name] / c.limit_s for c in constraints if row.get(c.name) is not None), default=0.0)


def search(m: ModelShape, hw: HardwareProfile, num_devices: int, concurrency: int, input_len: int,
           output_len: int, knobs: EngineKnobs, constraints: Sequence[Constraint] = (),
           kv_cache_memory_gb: Optional[float] = None) -> dict:
    rows: List[dict] = []
    for sp in splits(num_devices, m.heads, m.kv_heads, m.layers):
        row = {"tp": sp.tp, "pp": sp.pp, "dp": sp.dp}
        try:
            est = concurrency_estimate(m, hw, concurrency, input_len, output_len, replace(knobs, split=sp),
                                       kv_cache_memory_gb)
        except ValueError as e:
            rows.append(dict(row, fits=False, why=str(e)))
            continue
        c = est["at_concurrency"]
        row.update({k: c[k] for k in METRICS}, fits=True,
                   weights_per_device_gb=est["split"]["weights_per_device_gb"])
        row["meets_slo"] = all(con.ok(row) for con in constraints)
        rows.append(row)
    ok = [r for r in rows if r["fits"] and r["meets_slo"]]
    pick = max(ok, key=lambda r: (r["output_throughput"], -r["tp"])) if ok else None
    fits = [r for r in rows if r["fits"]]
    closest = None if pick or not fits else min(fits, key=lambda r: _worst_ratio(r, constraints))
    return {"num_devices": num_devices, "constraints": [str(c) for c in constraints], "splits": rows,
            "pick": pick, "closest": closest}


def render(res: dict) -> str:
    lines = [f"{res['num_devices']} devices; SLO: {'; '.join(res['constraints']) or 'none'}",
             "| tp | pp | dp | TTFT p50 (ms) | TTFT p95 (ms) | ITL p50 (ms) | ITL p95 (ms) | output tok/s | "
             "weights/device (GiB) | meets SLO |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["splits"]:
        head = f"| {r['tp']} | {r['pp']} | {r['dp']} |"
        if not r["fits"]:
            lines.append(f"{head} {r['why']} | | | | | | |")
            continue
        lines.append(f"{head} {r['ttft_median'] * 1e3:.1f} | {r['ttft_p95'] * 1e3:.1f} | {r['itl_median'] * 1e3:.2f} | "
                     f"{r['itl_p95'] * 1e3:.2f} | {r['output_throughput']:.1f} | {r['weights_per_device_gb']:.2f} | "
                     f"{'yes' if r['meets_slo'] else 'no'} |")
    p, c = res["pick"], res["closest"]
    if p:
        lines.append(f"pick: tp={p['tp']} pp={p['pp']} dp={p['dp']} ({p['output_throughput']:.1f} output tok/s)")
    elif c:
        lines.append(f"no split meets the SLO; closest: tp={c['tp']} pp={c['pp']} dp={c['dp']}")
    else:
        lines.append("no split fits these devices")
    return "\n".join(lines)
