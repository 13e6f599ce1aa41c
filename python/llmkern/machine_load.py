"""How busy the machine was with other work while one configuration ran.

The 1-minute load average includes the server under test (an engine keeps a 2-core box near 2),
so it cannot tell a quiet run from a shared one. What can: the CPU time the whole machine spent
(/proc/stat) minus the CPU time of this process and its descendants (the server, vLLM's engine
core, ...), as a share of the machine over the run. `foreign_cpu` near 0 is a quiet run; 0.5 on
2 cores is one other core-hog. Linux only; elsewhere every figure is None."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Optional

from .procs import tree_cpu_ticks

# Foreign CPU share above which a run is flagged as taken on a busy machine (a quarter of the
# machine: on 2 cores, half a core of other work).
DEFAULT_MAX_FOREIGN = 0.25


def _busy_jiffies() -> Optional[int]:
    try:
        with open("/proc/stat") as f:
            xs = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    return sum(xs[:8]) - xs[3] - xs[4]


@dataclass
class LoadMeter:
    """start() before the server starts, stop() after the run and before the server stops."""
    root: int = 0
    _t0: float = 0.0
    _busy0: Optional[int] = None
    _own0: int = 0
    load_before: Optional[float] = None

    def start(self) -> "LoadMeter":
        self.root = self.root or os.getpid()
        self.load_before = _loadavg()
        self._busy0 = _busy_jiffies()
        self._own0 = tree_cpu_ticks(self.root) if self._busy0 is not None else 0
        self._t0 = time.monotonic()
        return self

    def stop(self) -> Dict[str, Optional[float]]:
        """{'load_1m_before', 'load_1m_after', 'foreign_cpu'} (None where unknown)."""
        out = {"load_1m_before": self.load_before, "load_1m_after": _loadavg(), "foreign_cpu": None}
        busy = _busy_jiffies()
        if self._busy0 is None or busy is None:
            return out
        own = tree_cpu_ticks(self.root)
        wall = time.monotonic() - self._t0
        hz = os.sysconf("SC_CLK_TCK")
        cpus = os.cpu_count() or 1
        if wall > 0:
            foreign = ((busy - self._busy0) - (own - self._own0)) / hz / (wall * cpus)
            out["foreign_cpu"] = max(0.0, round(foreign, 4))
        return out


def _loadavg() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def settle(max_load: float, timeout_s: float = 180.0, poll_s: float = 1.0) -> float:
    """Waits until the 1-minute load average is under max_load, at most timeout_s; returns the
    seconds waited. For benchmarks that alternate engines: the average decays with a one-minute
    time constant, so on a 2-core box a run that kept both cores busy leaves it near 2 for a while
    after it ends, and the next run should start once that has passed."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        load = _loadavg()
        if load is None or load < max_load:
            break
        time.sleep(poll_s)
    return time.monotonic() - t0


def is_busy(load: Optional[Dict[str, Optional[float]]], max_foreign: float = DEFAULT_MAX_FOREIGN) -> bool:
    """True when other work used more than max_foreign of the machine during the run."""
    f = (load or {}).get("foreign_cpu")
    return f is not None and f > max_foreign
