"""One row of serving figures (latency percentiles, throughput, goodput under an SLO) per run."""
from __future__ import annotations

from typing import List, Optional

from ..engine.metrics import percentile
from .client import Result


def p(xs, q) -> Optional[float]:
    v = percentile(xs, q)
    return None if v is None else round(v, 4)


def summarise(system: str, rate: float, results: List[Result], wall: float, slo_ttft: float, slo_itl: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    itl = [x for r in ok for x in r.itls]
    e2e = [r.e2e for r in ok]
    good = [r for r in ok if r.ttft <= slo_ttft and (not r.itls or sum(r.itls) / len(r.itls) <= slo_itl)]

    return {"system": system, "rate": rate, "requests": len(results), "completed": len(ok),
            "refused": sum(1 for r in results if r.status == 429),
            "ttft_p50": p(ttft, 50), "ttft_p95": p(ttft, 95), "ttft_p99": p(ttft, 99),
            "itl_p50": p(itl, 50), "itl_p95": p(itl, 95), "itl_p99": p(itl, 99),
            "e2e_p50": p(e2e, 50), "e2e_p95": p(e2e, 95), "e2e_p99": p(e2e, 99),
            "out_tok_s": round(sum(r.tokens for r in ok) / wall, 2), "goodput_rps": round(len(good) / wall, 3),
            "wall_s": round(wall, 2)}


def summarise_tpot(system: str, rate: float, results: List[Result], wall: float, slo_ttft: float,
                   slo_tpot: float) -> dict:
    """summarise()'s row with `vllm bench serve`'s figures beside it: TPOT p50/p99 per request
    (Result.tpot), output tokens as the server counted them, and goodput under TTFT <= slo_ttft and
    TPOT <= slo_tpot (its --goodput)."""
    row = summarise(system, rate, results, wall, slo_ttft, float("inf"))
    ok = [r for r in results if r.ok]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    good = [r for r in ok if r.ttft <= slo_ttft and (r.tpot is None or r.tpot <= slo_tpot)]
    out = sum(r.usage_tokens if r.usage_tokens is not None else r.tokens for r in ok)
    row.update(tpot_p50=p(tpots, 50), tpot_p99=p(tpots, 99), out_tok_s=round(out / wall, 2),
               goodput_rps=round(len(good) / wall, 3))
    return row
