"""`serve --pd`'s connector set-up: the launcher hosts the rendezvous store and every replica,
rank 0 included, connects to it (so it outlives any replica); replicas started by hand keep rank
0 as the host. Then the torch connector (the default) through such a launcher, end to end: a
request is prefilled, its KV handed over (counted by the decode replica, nothing recomputed
there). The launcher and its replicas are reaped by the context
manager, also on failure."""
from __future__ import annotations

import argparse

import pytest

from llmkern.router.pd_launch import host_store, launch_connector_argv, pd_replica_argv
from llmkern.serve.pd import add_pd_args, connector_spec


def _args(*argv):
    p = argparse.ArgumentParser()
    add_pd_args(p)
    return p.parse_args(list(argv))


def _replica_spec(launcher_argv, role, rank, store_port):
    a = _args(*launcher_argv)
    own = pd_replica_argv(list(launcher_argv), role, rank, launch_connector_argv(a, store_port)(role, rank))
    return connector_spec(_args(*own))


def test_replicas_connect_to_the_launchers_store():
    store = host_store(None)          # what run_pd does: hosted here, on a free loopback port
    for rank, role in enumerate(("prefill", "decode")):
        spec = _replica_spec(["--pd", "1P1D"], role, rank, store.port)
        assert spec == {"kind": "p2p", "rank": rank, "world_size": 2, "master_addr": "127.0.0.1",
                        "master_port": store.port, "is_master": False, "backend": "gloo"}
    spec = _replica_spec(["--pd", "1P1D", "--kv-connector", "shm", "--kv-rendezvous", "10.0.0.1:29600"],
                         "prefill", 0, 29601)
    assert (spec["kind"], spec["master_addr"], spec["master_port"], spec["is_master"]) == ("shm", "10.0.0.1",
                                                                                             29601, False)
    assert _replica_spec(["--pd", "2P1D", "--kv-torch-backend", "nccl"], "decode", 2, 1)["backend"] == "nccl"
    # Without a launcher's store (the old way, and replicas started by hand): rank 0 hosts it.
    spec = _replica_spec(["--pd", "1P1D"], "prefill", 0, None)
    assert "is_master" not in spec
    spec = connector_spec(_args("--role", "decode", "--kv-rendezvous", "127.0.0.1:1", "--kv-rank", "1",
                                "--kv-world-size", "2"))
    assert "is_master" not in spec and spec["kind"] == "p2p"


def test_default_connector_through_the_launchers_store(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    import httpx

    from serve_helpers import ServerProcess, tiny_model_dir, wait_until
    from test_supervision_pd import ENGINE_ARGS, _handed_over, _workers

    model = tiny_model_dir(str(tmp_path / "tiny"))
    with ServerProcess(["--model", model, "--pd", "1P1D", *ENGINE_ARGS],
                       new_session=True) as pd:
        wait_until(lambda: all(w["healthy"] for w in _workers(pd).values()), 120, "both replicas healthy")
        _handed_over(pd)
        assert httpx.get(pd.base + "/health", timeout=10).status_code == 200
