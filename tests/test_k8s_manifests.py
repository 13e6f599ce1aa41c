"""The Kubernetes example (docs/k8s/*.yaml), checked offline: every object against the Kubernetes
API schema (kubernetes-validate, when installed), and always by hand for what the schema cannot
see: selectors that match their pods, Services that find a workload, the router's workers naming
the replicas' stable pod addresses and ports, and the llmkern arguments parsing as the commands
parse them (--kv-events-config active, each --worker spec with its ZMQ endpoints)."""
from __future__ import annotations

import glob
import os

import pytest

yaml = pytest.importorskip("yaml")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(glob.glob(os.path.join(REPO, "docs", "k8s", "*.yaml")))
K8S_VERSION = "1.30.0"


def _objects():
    out = []
    for path in FILES:
        with open(path) as f:
            out += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d is not None]
    return out


def _by_kind(kind):
    return {d["metadata"]["name"]: d for _, d in _objects() if d["kind"] == kind}


def _args(workload) -> list:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c["command"][1:] + c["args"]


def _opt(args, name) -> list:
    return [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]


def test_the_example_has_replicas_and_router_as_separate_workloads():
    assert [os.path.basename(p) for p in FILES] == ["replicas.yaml", "router.yaml"]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in _objects())
    assert kinds == [("Deployment", "llmkern-router"), ("Service", "llmkern"), ("Service", "llmkern-replica"),
                     ("StatefulSet", "llmkern-replica")]


def test_against_the_kubernetes_schema():
    kv = pytest.importorskip("kubernetes_validate")
    for name, d in _objects():
        kv.validate(d, K8S_VERSION, strict=True)   # raises on a missing, unknown or mistyped field


def test_selectors_services_and_ports_fit_together():
    workloads = list(_by_kind("StatefulSet").values()) + list(_by_kind("Deployment").values())
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items(), w["metadata"]["name"]
    for name, svc in _by_kind("Service").items():
        sel = svc["spec"]["selector"].items()
        targets = [w for w in workloads if sel <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(targets) == 1, f"Service {name} selects {len(targets)} workloads"
        (c,) = targets[0]["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            assert target in ports or target in ports.values(), (name, p)


def test_llmkern_arguments_parse_and_the_router_finds_every_replica():
    from llmkern.router.kv_zmq import parse_worker_spec
    from llmkern.serve.kv_events_config import parse_kv_events_config

    (sts,) = _by_kind("StatefulSet").values()
    (router,) = _by_kind("Deployment").values()
    rep_args, router_args = _args(sts), _args(router)
    assert rep_args[0] == "serve" and router_args[0] == "router"
    (cfg,) = _opt(rep_args, "--kv-events-config")
    cfg = parse_kv_events_config(cfg)
    assert cfg.active and cfg.replay_endpoint
    pub_port, replay_port = int(cfg.endpoint.rsplit(":", 1)[1]), int(cfg.replay_endpoint.rsplit(":", 1)[1])
    (http_port,) = map(int, _opt(rep_args, "--port"))
    assert _opt(rep_args, "--host") == ["0.0.0.0"] and _opt(router_args, "--host") == ["0.0.0.0"]
    svc = sts["spec"]["serviceName"]
    assert _by_kind("Service")[svc]["spec"]["clusterIP"] == "None"     # headless: one DNS name per pod
    expected = []
    for i in range(sts["spec"]["replicas"]):
        host = f"{sts['metadata']['name']}-{i}.{svc}"
        expected.append((f"http://{host}:{http_port}", {"endpoint": f"tcp://{host}:{pub_port}",
                                                       "replay": f"tcp://{host}:{replay_port}", "topic": cfg.topic}))
    assert [parse_worker_spec(w) for w in _opt(router_args, "--worker")] == expected
    assert _opt(router_args, "--model") == _opt(rep_args, "--model")   # the router's tokenizer is the replicas'
