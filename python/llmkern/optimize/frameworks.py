"""The servers `llmkern optimize --framework` sweeps: llmkern's own, vLLM's and SGLang's, each
started with its own flags for the sweep's knobs (llm-optimizer's `--framework vllm|sglang`).

Knobs use llmkern's names (or the aliases in knobs.ALIASES: tp, dp, chunked_prefill_size, ...);
each framework maps them to its own flags, and a knob it has no flag for is a clear error before
anything starts. The model must be a Hugging Face directory for vLLM and SGLang (without --model
the embedded model is written out as one)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

FRAMEWORKS = ("llmkern", "vllm", "sglang")

# knob -> flag with the value, or for on/off knobs (on flag or None, off flag or None)
_VLLM = {"tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
         "data_parallel_size": "--data-parallel-size", "max_num_seqs": "--max-num-seqs",
         "max_num_batched_tokens": "--max-num-batched-tokens", "block_size": "--block-size",
         "max_model_len": "--max-model-len", "gpu_memory_utilization": "--gpu-memory-utilization",
         "prefix_caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
         "chunked_prefill": ("--enable-chunked-prefill", "--no-enable-chunked-prefill")}
_SGLANG = {"tensor_parallel_size": "--tp-size", "pipeline_parallel_size": "--pp-size",
           "data_parallel_size": "--dp-size", "max_num_seqs": "--max-running-requests",
           "max_num_batched_tokens": "--chunked-prefill-size", "block_size": "--page-size",
           "max_model_len": "--context-length", "gpu_memory_utilization": "--mem-fraction-static",
           "prefix_caching": (None, "--disable-radix-cache"),
           "chunked_prefill": (None, ("--chunked-prefill-size", "-1"))}
_FLAGS = {"vllm": _VLLM, "sglang": _SGLANG}


def check(framework: str, server_knobs: Dict[str, Any]) -> None:
    """ValueError naming a knob the framework has no flag for (llmkern's are checked by knobs.canonical)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"--framework: expected one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if framework == "llmkern":
        return
    flags = _FLAGS[framework]
    for k in server_knobs:
        if k not in flags:
            raise ValueError(f"sweep key {k!r}: {framework} has no flag for it here (known: {', '.join(flags)})")


def flags(framework: str, server_knobs: Dict[str, Any]) -> List[str]:
    """The framework's command-line flags for server knobs (None / 'none' leaves a default)."""
    out: List[str] = []
    for k, v in server_knobs.items():
        f = _FLAGS[framework][k]
        if isinstance(f, tuple):
            pick = f[0] if v else f[1]
            if pick is not None:
                out += list(pick) if isinstance(pick, tuple) else [pick]
        elif v is not None and v != "none":
            out += [f, str(v)]
    return out


@dataclass
class Server:
    """How to start one configuration's server: argv with '{port}' to fill, extra environment."""
    argv: List[str]
    env: Dict[str, str]
    timeout: float


def server(framework: str, model_dir: str, server_knobs: Dict[str, Any], dtype: str, served: str,
           max_model_len: int, vllm_exe: Optional[str] = None, sglang_python: Optional[str] = None) -> Server:
    """The peer's start command (bench/peers_serving.py: the same binding and environment as the
    side-by-side benchmark) plus the configuration's flags. RuntimeError when it is not installed."""
    from ..bench import peers_serving

    peer = peers_serving.vllm_peer(vllm_exe) if framework == "vllm" else peers_serving.sglang_peer(sglang_python)
    if peer.argv is None:
        raise RuntimeError(f"--framework {framework}: {peer.not_run}")
    return Server(peer.argv(model_dir, dtype, served, max_model_len) + flags(framework, server_knobs),
                  dict(peer.env), peer.timeout)


def version(framework: str, vllm_exe: Optional[str] = None, sglang_python: Optional[str] = None) -> str:
    """The framework's version as it reports it ('' when it cannot tell)."""
    from .. import __version__
    from ..bench import peers_serving

    if framework == "llmkern":
        return __version__
    env = dict(os.environ)
    if framework == "vllm":
        exe = peers_serving.find_vllm(vllm_exe)
        if exe is None:
            return ""
        cmd = [exe, "--version"]
        env.update(peers_serving.vllm_env())   # its CLI needs the CPU backend named
    else:
        cmd = [sglang_python or sys.executable, "-c", "import sglang; print(sglang.__version__)"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1] if out.returncode == 0 and lines else ""
