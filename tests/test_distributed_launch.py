"""Multi-machine launch, on loopback: two "nodes" of two ranks each, every rank started the way a
torchrun-style launcher starts it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in the environment, the same command line everywhere: `python -m llmkern.cli.torchrun
generate ...`). Rank 0 runs the engine through the CLI (-tp 2 -pp 2, one stage per node); its JSONL
output must hold the single-process engine's greedy tokens. Also the CLI's local launch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams

from distributed_helpers import PROMPTS, free_port, make_model, one_thread, worker_children

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist_launch")
    model = make_model(str(root), "qwen2")
    inp = root / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    with one_thread():
        llm = LLM(model)
        ref = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                                          ignore_eos=True), use_tqdm=False)]
    return model, inp, root, ref


def _args(model, inp, out, *extra):
    return ["generate", "--model", str(model), "--input", str(inp), "--output", str(out), "--quiet",
            "--max-tokens", str(MAX_TOKENS), "--ignore-eos", *extra]


def _tokens(out):
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]


def test_two_nodes_env_launch(setup):
    model, inp, root, ref = setup
    out = root / "two_nodes.jsonl"
    port = free_port()
    cmd = [sys.executable, "-m", "llmkern.cli.torchrun", *_args(model, inp, out, "-tp", "2", "-pp", "2")]
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    procs = []
    try:
        for node in (0, 1):
            for local in (0, 1):
                env = dict(base, RANK=str(2 * node + local), LOCAL_RANK=str(local), GROUP_RANK=str(node))
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=400) for p in procs]
        for p, (_, err) in zip(procs, results):
            assert p.returncode == 0, err[-3000:]
        assert _tokens(out) == ref
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_cli_local_launch(setup):
    model, inp, root, ref = setup
    out = root / "local.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for k in ("RANK", "WORLD_SIZE"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "llmkern.cli", *_args(model, inp, out, "--tensor-parallel-size", "2")],
                       env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _tokens(out) == ref
    assert worker_children() == []


def test_worker_entry_needs_the_launcher_environment():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.run([sys.executable, "-m", "llmkern.distributed.worker"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "RANK" in p.stderr and "Traceback" not in p.stderr
