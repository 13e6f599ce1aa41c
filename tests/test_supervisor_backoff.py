"""ReplicaSupervisor's restart schedule without processes: stand-in processes that exit when told,
the watch step driven with chosen times. A replica that keeps exiting is started again after 1, 2,
4 ... s, never more than 30 s apart; the delay falls back to 1 s once a replica stayed healthy for
a minute; an exit takes the replica out of the router at once; nothing restarts while stopping."""
from __future__ import annotations

import pytest

pytest.importorskip("httpx")

from llmkern.router.supervisor import CRASHED, KILLED, Replica, ReplicaSupervisor  # noqa: E402
from llmkern.router.worker import Worker  # noqa: E402

URL = "http://127.0.0.1:1"


class FakeProc:
    count = 0

    def __init__(self):
        FakeProc.count += 1
        self.pid = 1000 + FakeProc.count
        self.returncode = None

    def poll(self):
        return self.returncode


class FakeRouter:
    def __init__(self):
        self.workers = {URL: Worker(URL)}


def _supervisor():
    rep = Replica(URL, FakeProc, FakeProc())
    sup = ReplicaSupervisor([rep])
    sup.router = FakeRouter()
    return sup, rep, sup.router.workers[URL]


def test_backoff_doubles_to_30_s_then_resets_after_a_healthy_minute():
    sup, rep, w = _supervisor()
    delays, now = [], 0.0
    for _ in range(7):
        rep.proc.returncode = 1
        sup._tick(rep, now)
        delays.append(rep.restart_at - now)
        now = rep.restart_at
        sup._tick(rep, now)
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert rep.restarts == 7 and rep.exits == {CRASHED: 7}
    # Healthy for a minute: the next exit is restarted after 1 s again.
    w.healthy = True
    sup._tick(rep, now + 1)
    rep.proc.returncode = -9
    sup._tick(rep, now + 62)
    assert rep.restart_at - (now + 62) == 1 and rep.exits[KILLED] == 1


def test_an_exit_takes_the_worker_out_at_once_and_nothing_restarts_while_stopping():
    sup, rep, w = _supervisor()
    w.healthy = True
    rep.proc.returncode = -9
    sup._tick(rep, 0.0)
    assert not w.healthy and rep.last_exit[1] == KILLED
    sup.stopping = True
    old = rep.proc
    sup._tick(rep, 100.0)
    assert rep.proc is old and rep.restarts == 0
