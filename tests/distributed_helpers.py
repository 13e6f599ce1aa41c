"""Helpers for the model-parallel tests: tiny checkpoints, a workload that exercises prefix caching,
preemption, chunked prefill and n-gram speculation, and checks that no worker process is left."""
from __future__ import annotations

import os
import socket
from typing import List

import llmkern
import torch

from runtime_helpers import tiny_hf_model

# Llama: 4 heads, 2 KV heads (split at T=2); Qwen2: 1 KV head (replicated at T=2), qkv bias, and a
# vocabulary of 250 (padded to a multiple of T for the vocab-parallel head); llama_kv3: 3 KV heads
# over 2 ranks (2 + 1, as SmolLM2's).
MODELS = {"llama": dict(arch="llama"), "qwen2": dict(arch="qwen2", num_key_value_heads=1, vocab_size=250),
          "llama_kv3": dict(arch="llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3)}

BASE = [3, 4, 5, 6, 7, 8, 9, 10]  # a shared prefix of two blocks: prefix-cache hits
PROMPTS = [BASE + [5, 6, 7, 8, 9, 10, 11][i:] * 2 for i in range(6)]

NGRAM = dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3,
             disable_by_batch_size=None)


def engine_kwargs(arch: str) -> dict:
    """16 blocks of 4 tokens for up to 3 sequences of ~50 tokens: preemption is certain; chunked
    prefill with a 16-token budget. Llama preempts by swapping and keeps evicted prefix blocks in a
    host tier (block copies every rank must replay); Qwen2 preempts by recomputing."""
    kw = dict(block_size=4, num_gpu_blocks=16, max_num_seqs=3, max_num_batched_tokens=16, speculative=NGRAM)
    if arch.startswith("llama"):
        kw.update(preemption_mode="swap", num_swap_blocks=32, num_cpu_offload_blocks=16)
    return kw


def make_model(root: str, arch: str) -> str:
    path = os.path.join(root, arch)
    kw = dict(MODELS[arch])
    tiny_hf_model(path, kw.pop("arch"), **kw)
    return path


def one_thread():
    """Context: one thread for torch and llmkern (what each rank gets on a 2-core machine), so the
    single-process reference runs the same kernels' code paths."""
    class _Ctx:
        def __enter__(self):
            self.saved = torch.get_num_threads(), llmkern.get_num_threads()
            torch.set_num_threads(1)
            llmkern.set_num_threads(1)

        def __exit__(self, *exc):
            torch.set_num_threads(self.saved[0])
            llmkern.set_num_threads(self.saved[1])

    return _Ctx()


def worker_children(pid: int = None) -> List[int]:
    """Live llmkern worker processes whose parent is `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z" and b"llmkern.distributed.worker" in cmd:
            out.append(int(d))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
