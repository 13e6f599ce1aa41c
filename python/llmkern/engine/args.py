"""Command-line options of the engine and of sampling, shared by every command that runs an engine
(generate, embed, serve, the optimiser's server knobs), and how errors name the option."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default (except None / False, which mean "off" or "automatic")."""

    def _get_help_string(self, action):
        h = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings and "%(default)" not in h:
            h += " (default: %(default)s)"
        return h


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    g.add_argument("--load-format", default="auto", choices=["auto", "hf", "gguf", "dummy"],
                   help="how to read --model (dummy: random weights from its config)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    g.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on GPU)")
    g.add_argument("--quantization", default="auto", choices=["auto", "gguf", "none"],
                   help="auto / gguf: a GGUF's quantised projections run as stored, dequantised inside the "
                        "kernels; none: dequantise them to --dtype at load")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step (default 2048; `llmkern serve` on a CPU: 512, which measured the same "
                        "throughput and a 25-30%% sooner first token for a burst of prompts)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV cache size in GiB (default: 2 on CPU, free memory x 0.85 on GPU)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="exactly this many KV-cache blocks, whatever the memory (benchmarks, tests)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    g.add_argument("--no-chunked-prefill", action="store_true", help="run each prompt's prefill in one step")
    g.add_argument("--cpu-offload-gb", type=float, default=0.0, help="host tier for evicted prefix blocks, GiB")
    g.add_argument("--kv-disk-path", default=None, metavar="DIR",
                   help="disk tier for evicted prefix blocks, shared by the engines pointed at DIR and kept "
                        "across restarts (default: off)")
    g.add_argument("--kv-disk-gb", type=float, default=None, help="size bound of --kv-disk-path (default: 10 GiB)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"],
                   help="KV cache storage: auto = the model dtype; fp8 (= fp8_e4m3), fp8_e5m2, int8 = one byte "
                        "per element, scales calibrated per layer and kv head at start (about 2x the blocks of bf16)")
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"],
                   help="what preemption does with a sequence's KV blocks")
    g.add_argument("--scheduler", default="continuous", choices=["continuous", "static", "dynamic"],
                   help="continuous batching; static: a batch runs to completion before the next; dynamic: "
                        "static, started once --max-batch-size wait or the oldest waited --max-wait-ms")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split every layer over this many processes (Megatron-style)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="split the layers into this many stages, one process group each")
    g.add_argument("--expert-parallel-size", "-ep", type=int, default=1,
                   help="MoE models: spread the experts over this many processes (tokens dispatched with "
                        "all-to-all; attention tensor-parallel over the same processes)")
    g.add_argument("--distributed-timeout-s", type=float, default=60.0,
                   help="with -tp/-pp: a collective not complete by then stops the engine with an error")
    g.add_argument("--speculative", default=None, metavar="METHOD[:K][,key=value...]",
                   help="speculative decoding, e.g. ngram:4 (prompt lookup), early_exit:3,num_layers=12, "
                        "draft:4,model=PATH (default: off)")


def engine_kwargs(a) -> dict:
    """EngineConfig keyword arguments from the options of add_engine_args (and of serve's
    scheduling options where the command has them)."""
    return dict(device=a.device, dtype=a.dtype, quantization=a.quantization, max_model_len=a.max_model_len,
                max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens or 2048, block_size=a.block_size,
                kv_cache_memory_gb=a.kv_cache_memory_gb, num_gpu_blocks=getattr(a, "num_gpu_blocks_override", None),
                enable_prefix_caching=not a.no_prefix_caching,
                enable_chunked_prefill=not a.no_chunked_prefill, cpu_offload_gb=a.cpu_offload_gb,
                kv_disk_path=getattr(a, "kv_disk_path", None), kv_disk_gb=getattr(a, "kv_disk_gb", None),
                kv_cache_dtype=getattr(a, "kv_cache_dtype", "auto"),
                preemption_mode=a.preemption_mode, scheduler=a.scheduler,
                speculative=getattr(a, "speculative", None), policy=getattr(a, "policy", "fcfs"),
                max_wait_ms=getattr(a, "max_wait_ms", 0.0),
                tensor_parallel_size=a.tensor_parallel_size, pipeline_parallel_size=a.pipeline_parallel_size,
                expert_parallel_size=a.expert_parallel_size,
                distributed_timeout_s=a.distributed_timeout_s, schedule=getattr(a, "schedule", "arrival"))


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (defaults for every prompt; JSONL lines may override)")
    g.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate per prompt")
    g.add_argument("--min-tokens", type=int, default=0, help="EOS and stop tokens are masked until this many")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    g.add_argument("--seed", type=int, default=None, help="per-request seed (default: the engine's generator)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")


def sampling_dict(a) -> dict:
    return dict(max_tokens=a.max_tokens, min_tokens=a.min_tokens, temperature=a.temperature, top_k=a.top_k,
                top_p=a.top_p, min_p=a.min_p, repetition_penalty=a.repetition_penalty, seed=a.seed,
                stop=a.stop, ignore_eos=a.ignore_eos)


CONFIG_FLAGS = {"num_gpu_blocks": "num_gpu_blocks_override"}   # config field -> flag, where they differ


def as_option(msg: str) -> str:
    """'max_tokens: expected ...' -> '--max-tokens: expected ...' (errors name the flag the user typed)."""
    field, sep, rest = msg.partition(":")
    if sep and field.isidentifier():
        field = CONFIG_FLAGS.get(field, field)
        return f"--{field.replace('_', '-')}:{rest}"
    return msg
