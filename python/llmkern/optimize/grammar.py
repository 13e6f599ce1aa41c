"""The sweep and constraint grammar of `llmkern optimize` (llm-optimizer's, where they overlap).

Sweep: `;`-separated terms, the configurations are their cartesian product:
    key=[a,b,c]                 a list of values (ints, floats, none/true/false/on/off, bare words)
    key=range(start,stop[,step])  Python's range (stop excluded)
    key=value                   one fixed value
    k1*k2=[(1,2),(2,1)]         paired keys: each tuple sets all of them at once
Constraints: `;`-separated `metric:stat<value[unit]`, metric ttft|itl|e2e_latency, stat
mean|median|p95|p99, op < or <=, unit ms (the default) or s, e.g. "ttft:p95<500ms;itl:p95<50ms".
Errors are ValueError naming the token that could not be read."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

METRICS = ("ttft", "itl", "e2e_latency")
STATS = ("mean", "median", "p95", "p99")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORD = re.compile(r"^[A-Za-z0-9_.:+\-/]+$")


def parse_value(tok: str, where: str) -> Any:
    """One scalar: int, float, None (none/null), bool (true/false/on/off) or a bare word."""
    t = tok.strip()
    if not t:
        raise ValueError(f"{where}: empty value")
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "on"):
        return True
    if low in ("false", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if not _WORD.match(t):
        raise ValueError(f"{where}: cannot read value {t!r}")
    return t


def _split_top(s: str, sep: str) -> List[str]:
    """Split on sep outside brackets/parentheses."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _parse_values(rhs: str, term: str) -> List[Any]:
    r = rhs.strip()
    m = re.fullmatch(r"range\((.*)\)", r)
    if m:
        try:
            args = [int(x) for x in m.group(1).split(",")]
        except ValueError:
            raise ValueError(f"sweep term {term!r}: range() takes integers, got {r!r}") from None
        if not 1 <= len(args) <= 3 or (len(args) == 3 and args[2] == 0):
            raise ValueError(f"sweep term {term!r}: expected range(start, stop[, step]) with step != 0, got {r!r}")
        vals = list(range(*args))
        if not vals:
            raise ValueError(f"sweep term {term!r}: {r} is empty")
        return vals
    if r.startswith("["):
        if not r.endswith("]"):
            raise ValueError(f"sweep term {term!r}: list {r!r} has no closing ']'")
        inner = r[1:-1].strip()
        if not inner:
            raise ValueError(f"sweep term {term!r}: empty list")
        return [parse_value(x, f"sweep term {term!r}") for x in _split_top(inner, ",")]
    if r.startswith(("(", "range")) or "[" in r or "]" in r:
        raise ValueError(f"sweep term {term!r}: cannot read {r!r} (expected [a,b], range(a,b,s) or a value)")
    return [parse_value(r, f"sweep term {term!r}")]


def _parse_tuples(rhs: str, keys: List[str], term: str) -> List[Tuple]:
    r = rhs.strip()
    if not (r.startswith("[") and r.endswith("]")):
        raise ValueError(f"sweep term {term!r}: paired keys take a list of tuples, e.g. [(1,2),(2,1)]")
    out = []
    for item in _split_top(r[1:-1], ","):
        it = item.strip()
        if not (it.startswith("(") and it.endswith(")")):
            raise ValueError(f"sweep term {term!r}: expected a tuple like (1,2), got {it!r}")
        vals = [parse_value(x, f"sweep term {term!r}") for x in it[1:-1].split(",")]
        if len(vals) != len(keys):
            raise ValueError(f"sweep term {term!r}: tuple {it} has {len(vals)} values for {len(keys)} keys "
                             f"{'*'.join(keys)}")
        out.append(tuple(vals))
    return out


def parse_sweep(spec: str) -> List[Dict[str, Any]]:
    """All configurations of a sweep spec, in order (the last key varies fastest)."""
    axes: List[List[Dict[str, Any]]] = []
    seen: set = set()
    for term in _split_top(spec or "", ";"):
        term = term.strip()
        if not term:
            continue
        if "=" not in term:
            raise ValueError(f"sweep term {term!r}: expected key=[values], key=range(...) or k1*k2=[(..),(..)]")
        lhs, rhs = term.split("=", 1)
        keys = [k.strip() for k in lhs.split("*")]
        for k in keys:
            if not _KEY.match(k):
                raise ValueError(f"sweep term {term!r}: bad key {k!r}")
            if k in seen:
                raise ValueError(f"sweep term {term!r}: key {k!r} appears twice")
            seen.add(k)
        if len(keys) == 1:
            axes.append([{keys[0]: v} for v in _parse_values(rhs, term)])
        else:
            axes.append([dict(zip(keys, t)) for t in _parse_tuples(rhs, keys, term)])
    configs = []
    for combo in itertools.product(*axes):
        d: Dict[str, Any] = {}
        for part in combo:
            d.update(part)
        configs.append(d)
    return configs


@dataclass(frozen=True)
class Constraint:
    metric: str      # ttft | itl | e2e_latency
    stat: str        # mean | median | p95 | p99
    op: str          # < | <=
    limit_s: float   # seconds

    @property
    def name(self) -> str:
        """The metric name in the database (e.g. ttft_p95)."""
        return f"{self.metric}_{self.stat}"

    def ok(self, metrics: Dict[str, Any]) -> bool:
        v = metrics.get(self.name)
        if v is None:
            return False
        return v < self.limit_s if self.op == "<" else v <= self.limit_s

    def __str__(self) -> str:
        return f"{self.metric}:{self.stat}{self.op}{self.limit_s * 1e3:g}ms"


_CONSTRAINT = re.compile(r"^([a-z_0-9]+):([a-z0-9]+)\s*(<=|<)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)$")


def parse_constraints(spec: str) -> List[Constraint]:
    out = []
    for term in (spec or "").split(";"):
        term = term.strip()
        if not term:
            continue
        m = _CONSTRAINT.match(term)
        if not m:
            raise ValueError(f"constraint {term!r}: expected METRIC:STAT<VALUE[ms|s], e.g. ttft:p95<500ms")
        metric, stat, op, num, unit = m.groups()
        if metric not in METRICS:
            raise ValueError(f"constraint {term!r}: unknown metric {metric!r} (expected one of {', '.join(METRICS)})")
        if stat not in STATS:
            raise ValueError(f"constraint {term!r}: unknown statistic {stat!r} (expected one of {', '.join(STATS)})")
        scale = {"": 1e-3, "ms": 1e-3, "s": 1.0}.get(unit)
        if scale is None:
            raise ValueError(f"constraint {term!r}: unknown unit {unit!r} (expected ms or s)")
        out.append(Constraint(metric, stat, op, float(num) * scale))
    return out
