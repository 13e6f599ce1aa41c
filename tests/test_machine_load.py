"""The load recorded with each optimiser run: CPU time of processes outside the measured tree, as a
share of the machine (machine_load.py), checked against processes whose CPU use is known."""
import os
import subprocess
import sys
import time

import pytest

from llmkern import machine_load

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")

BURN = "import time\nt = time.time() + {s}\nwhile time.time() < t: pass\n"


def _burners(n: int, seconds: float, detached: bool):
    """n processes spinning for `seconds`; detached ones are re-parented away from this process
    (a shell starts them in the background and exits), as another job's processes would be."""
    code = BURN.format(s=seconds)
    if detached:
        cmd = " ".join(f"{sys.executable} -c '{code}' >/dev/null 2>&1 &" for _ in range(n))
        subprocess.run(["sh", "-c", cmd], check=True)
        return []
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _measure(n, detached, seconds=1.5):
    m = machine_load.LoadMeter().start()
    procs = _burners(n, seconds, detached)
    time.sleep(seconds)
    if not detached:
        for p in procs:
            p.wait(10)
    return m.stop()


def test_other_processes_count_as_load_and_our_own_do_not():
    n = os.cpu_count() or 1
    other = _measure(n, detached=True)
    time.sleep(0.5)
    own = _measure(n, detached=False)
    # every CPU spun for the whole window in another tree: most of the machine is foreign
    assert other["foreign_cpu"] > 0.6, other
    assert machine_load.is_busy(other)
    # the same work in our own children is ours (reaped children land in our cutime)
    assert own["foreign_cpu"] < other["foreign_cpu"] - 0.4, (own, other)
    assert own["load_1m_before"] is not None and own["load_1m_after"] is not None


def test_is_busy_threshold():
    assert not machine_load.is_busy(None) and not machine_load.is_busy({"foreign_cpu": None})
    assert not machine_load.is_busy({"foreign_cpu": 0.1}) and machine_load.is_busy({"foreign_cpu": 0.3})
    assert not machine_load.is_busy({"foreign_cpu": 0.3}, max_foreign=0.5)


def test_settle_waits_for_the_load_average_to_fall(monkeypatch):
    """settle: polls until the 1-minute load is under the bound, and gives up at its timeout."""
    loads = iter([2.0, 1.9, 1.6, 1.2, 0.5])
    polls = []
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (polls.append(1) or next(loads), 0.0, 0.0))
    machine_load.settle(1.5, timeout_s=30, poll_s=0.01)
    assert len(polls) == 4  # 2.0, 1.9, 1.6 too high; 1.2 under the bound ends the wait
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    waited = machine_load.settle(1.5, timeout_s=0.3, poll_s=0.05)
    assert 0.3 <= waited < 5
    assert machine_load.settle(1e9) < 1  # a quiet enough machine: no wait


def test_wait_idle_waits_out_a_descendant_that_burns_cpu():
    """procs.wait_idle: returns once the whole tree (here a grandchild) stops using the CPU, not
    before; at once for an idle tree. tree_cpu_ticks counts the grandchild's time."""
    from llmkern.procs import tree_cpu_ticks, wait_idle

    parent = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {BURN.format(s=1.2)!r}])\n"
              "time.sleep(8)\n")
    busy = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
    try:
        time.sleep(0.3)  # the grandchild is spinning by now
        t0, ticks0 = time.monotonic(), tree_cpu_ticks(busy.pid)
        waited = wait_idle(busy.pid)
        burnt = (tree_cpu_ticks(busy.pid) - ticks0) / os.sysconf("SC_CLK_TCK")
        assert 0.5 < waited < 5 and time.monotonic() - t0 >= waited, waited
        assert burnt > 0.4, burnt  # the grandchild's CPU time is the tree's
        assert wait_idle(idle.pid) < 0.5
    finally:
        os.killpg(busy.pid, 9)
        idle.kill()
        busy.wait(10), idle.wait(10)
