"""EngineConfig: scheduler, KV-cache and device settings, validated up front."""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, fields
from typing import Optional

import torch

from ..distributed.spec import ParallelSpec
from ..kvcache.spec import KVSpec


@dataclass
class EngineConfig:
    device: Optional[str] = None            # default: cuda when present, else cpu
    dtype: Optional[str] = None             # "float32" | "bfloat16" | "float16"; default fp32 CPU, bf16 GPU
    max_model_len: Optional[int] = None     # default: the model's context length
    # weights: "auto" (a GGUF's quantised projections run as stored, dequantised in the kernels),
    # "gguf" (the same, an error for other checkpoints), None / "none" (dequantise to dtype at load)
    quantization: Optional[str] = "auto"
    # scheduling
    scheduler: str = "continuous"           # "continuous" | "static" (admit a batch, run it to the end)
    #   | "dynamic" (static, but a batch starts only once max_num_seqs wait or the oldest has
    #   waited max_wait_ms)
    schedule: str = "arrival"               # admission order: "arrival" (FCFS) | "throughput" (offline:
                                            # shared prefixes grouped and computed once, biggest first)
    policy: str = "fcfs"                    # "fcfs" | "priority" (lower Request.priority first)
    max_wait_ms: float = 0.0                # dynamic: how long the oldest request may wait for a full batch
    # continuous: a step that admits new prompts leaves the running decodes out (they run in the
    # next step) at most this many steps in a row, so a new request's first token does not wait for
    # them; 0 mixes them in every step (scheduler.py)
    decode_defer_steps: int = 0
    # continuous, chunked: while a long prompt is prefilled in chunks, waiting prompts that fit whole
    # into this share of the token budget join the step beside its next chunk (0: strict arrival order)
    short_prompt_share: float = 0.5
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048      # token budget per step
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"      # "recompute" | "swap"
    # KV cache
    block_size: int = 16
    kv_cache_memory_gb: Optional[float] = None  # default CPU: 2 GiB; GPU: gpu_memory_utilization
    gpu_memory_utilization: float = 0.85
    num_gpu_blocks: Optional[int] = None    # overrides the memory budget (tests, benchmarks)
    enable_prefix_caching: bool = True
    cpu_offload_gb: float = 0.0             # host tier for evicted prefix blocks (0 = off)
    num_cpu_offload_blocks: Optional[int] = None
    swap_space_gb: float = 1.0              # host blocks for preemption by swap
    # disk tier below the host one (kvcache.disk_tier): evicted prefix blocks as files under this
    # directory, shared by the engines pointed at it and kept across restarts; None = off
    kv_disk_path: Optional[str] = None
    kv_disk_gb: Optional[float] = None      # its size bound (default with a path: 10 GiB)
    num_swap_blocks: Optional[int] = None
    kv_prefault: bool = False               # CPU: fault the KV cache's pages in at start-up (servers)
    # KV storage (vLLM's names): "auto" = the model dtype; "fp8" (= "fp8_e4m3"), "fp8_e5m2", "int8" =
    # one byte per element (engine/kv_quant.py), with scales per layer and kv head calibrated at start
    # from the model's own K/V, or fixed by kv_scales: one number, or per layer a (k, v) pair of a
    # number or num_kv_heads numbers each
    kv_cache_dtype: str = "auto"
    kv_scales: Optional[object] = None
    seed: int = 0                           # sampling seed of requests without their own
    enforce_eager: bool = False             # GPU: no CUDA graphs for decode steps
    # speculative decoding: None (off), a dict {"method": "ngram" | "draft" | "early_exit", ...}
    # or "METHOD[:K][,key=value...]" (see spec_config.SpecConfig)
    speculative: Optional[object] = None
    # model parallelism (llmkern.distributed): T x P ranks, each its own process; the engine's
    # process is rank 0 and spawns the others (or joins ranks started by torchrun, see docs/scale-out.md)
    tensor_parallel_size: int = 1           # Megatron-style shards of every layer
    pipeline_parallel_size: int = 1         # contiguous stages of layers
    expert_parallel_size: int = 1           # MoE: experts spread over this many ranks per stage
    #   (attention tensor-parallel over the same ranks; equal to tensor_parallel_size when both > 1)
    distributed_timeout_s: float = 60.0     # a collective not complete by then is an error
    # micro-batches in the pipeline at once (pipeline_parallel_size > 1); None: one per stage, so no
    # stage idles while another works (vLLM's "virtual engines"); 1: one step at a time
    pipeline_micro_batches: Optional[int] = None
    # prefill-decode disaggregation (llmkern.pd): "both" (co-located), "prefill" (one
    # token, then the KV blocks are handed over), "decode" (takes requests with kv_transfer_params)
    kv_role: str = "both"
    # a KVConnector, or a dict for llmkern.pd.build_connector, e.g.
    # {"kind": "p2p" | "shm", "rank": 0, "world_size": 2, "master_addr": "127.0.0.1", "master_port": N},
    # or just the kind ("torch" = "p2p", "shm") with the rest in kv_connector_options
    # ({"rendezvous": "HOST:PORT", "rank": R, "world_size": W, ...})
    kv_connector: Optional[object] = None
    kv_connector_options: Optional[dict] = None
    kv_transfer_timeout_s: float = 30.0     # prefill: blocks pinned this long at most; decode: KV wait
    kv_transfer_fallback: str = "fail"      # decode, transfer failed: "fail" (error) | "recompute" here

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

        if self.schedule not in ("arrival", "throughput"):
            bad("schedule", "'arrival' or 'throughput'")
        if self.scheduler not in ("continuous", "static", "dynamic"):
            bad("scheduler", "'continuous', 'static' or 'dynamic'")
        if self.policy not in ("fcfs", "priority"):
            bad("policy", "'fcfs' or 'priority'")
        if not _is_num(self.short_prompt_share) or not 0 <= self.short_prompt_share <= 1:
            bad("short_prompt_share", "a fraction of the token budget in [0, 1]")
        if not isinstance(self.decode_defer_steps, int) or isinstance(self.decode_defer_steps, bool) \
                or self.decode_defer_steps < 0:
            bad("decode_defer_steps", "an integer >= 0")
        if not isinstance(self.max_wait_ms, (int, float)) or isinstance(self.max_wait_ms, bool) or \
                not 0 <= self.max_wait_ms < float("inf"):
            bad("max_wait_ms", "a finite number of milliseconds >= 0")
        if self.preemption_mode not in ("recompute", "swap"):
            bad("preemption_mode", "'recompute' or 'swap'")
        if not isinstance(self.kv_prefault, bool):
            bad("kv_prefault", "True or False")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size",
                     "pipeline_parallel_size", "expert_parallel_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "an integer >= 1")
        for name, lo in (("max_model_len", 1), ("num_gpu_blocks", 1), ("num_cpu_offload_blocks", 0),
                         ("num_swap_blocks", 0)):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                bad(name, f"an integer >= {lo}, or unset")
        for name in ("cpu_offload_gb", "swap_space_gb"):
            v = getattr(self, name)
            if not _is_num(v) or v < 0:
                bad(name, "a size in GiB >= 0")
        if self.kv_cache_memory_gb is not None and (not _is_num(self.kv_cache_memory_gb)
                                                    or self.kv_cache_memory_gb <= 0):
            bad("kv_cache_memory_gb", "a size in GiB > 0")
        if 1 < self.tensor_parallel_size != self.expert_parallel_size > 1:
            raise ValueError(f"expert_parallel_size: {self.expert_parallel_size} must equal tensor_parallel_size "
                             f"{self.tensor_parallel_size} when both are > 1 (the experts are spread over the "
                             f"ranks that split attention)")
        v = self.pipeline_micro_batches
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            bad("pipeline_micro_batches", "an integer >= 1 or None")
        if not (isinstance(self.distributed_timeout_s, (int, float)) and self.distributed_timeout_s > 0):
            bad("distributed_timeout_s", "a number of seconds > 0")
        if self.kv_role not in ("both", "prefill", "decode"):
            bad("kv_role", "'both', 'prefill' or 'decode'")
        if self.kv_role != "both" and self.kv_connector is None:
            raise ValueError(f"kv_connector: kv_role={self.kv_role!r} needs a KV connector")
        if isinstance(self.kv_connector, str):
            if self.kv_connector not in ("torch", "p2p", "shm"):
                bad("kv_connector", "'torch', 'p2p' or 'shm' (or a KVConnector, or a dict spec)")
            self.kv_connector = dict(self.kv_connector_options or {}, kind=self.kv_connector)
        elif self.kv_connector_options is not None:
            raise ValueError("kv_connector_options: only with kv_connector given as a kind ('torch', 'shm')")
        if self.kv_connector is not None and not hasattr(self.kv_connector, "poll") and \
                not isinstance(self.kv_connector, dict):
            bad("kv_connector", "a KVConnector, a dict spec or a kind ('torch', 'shm')")
        if not _is_num(self.kv_transfer_timeout_s) or self.kv_transfer_timeout_s <= 0:
            bad("kv_transfer_timeout_s", "a number of seconds > 0")
        if self.kv_transfer_fallback not in ("fail", "recompute"):
            bad("kv_transfer_fallback", "'fail' or 'recompute'")
        self._check_kv_cache_dtype()
        self._check_device()
        self._check_memory()
        self._check_disk_tier()
        if not 0 < self.gpu_memory_utilization <= 1:
            bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.dtype is not None and self.dtype not in _DTYPES:
            bad("dtype", f"one of {', '.join(_DTYPES)}")
        if self.quantization not in (None, "auto", "gguf", "none"):
            bad("quantization", "'auto', 'gguf', 'none' or None")
        if self.quantization == "gguf" and self.world_size > 1:  # model-parallel ranks load dense shards
            bad("quantization", "'auto' or None with tensor/pipeline/expert parallelism (its ranks dequantise)")
        if self.speculative is not None:
            from .spec_config import SpecConfig

            self.speculative = SpecConfig.parse(self.speculative)

    def _check_kv_cache_dtype(self) -> None:
        from ..layers.kv_quant import check_kv_cache_dtype

        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.kv_cache_dtype == "auto":
            if self.kv_scales is not None:
                raise ValueError("kv_scales: only with a quantised kv_cache_dtype ('fp8', 'fp8_e5m2', 'int8')")
            return
        if self.speculative is not None:
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype!r} is not supported with speculative decoding "
                             "(the draft's layers share the cache)")
        if self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype!r} is not supported with tensor/pipeline "
                             "parallelism")

    def _check_device(self) -> None:
        if self.device is None:
            return
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError, ValueError):
            raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {self.device!r}") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device: {self.device!r} is not supported (expected 'cpu', 'cuda' or 'cuda:N')")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} was asked for, but no CUDA device is available "
                                 f"(torch.cuda.is_available() is False); use device 'cpu'")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ValueError(f"device: {self.device!r}, but only {torch.cuda.device_count()} CUDA device(s) exist")

    def _check_disk_tier(self) -> None:
        if self.kv_disk_gb is not None and (not _is_num(self.kv_disk_gb) or self.kv_disk_gb <= 0):
            raise ValueError(f"kv_disk_gb: expected a size in GiB > 0, got {self.kv_disk_gb!r}")
        if self.kv_disk_path is None:
            if self.kv_disk_gb is not None:
                raise ValueError("kv_disk_gb: needs kv_disk_path (the directory of the disk KV tier)")
            return
        if not isinstance(self.kv_disk_path, (str, os.PathLike)) or not os.fspath(self.kv_disk_path):
            raise ValueError(f"kv_disk_path: expected a directory path, got {self.kv_disk_path!r}")
        if not self.enable_prefix_caching:
            raise ValueError("kv_disk_path: the disk KV tier needs prefix caching (enable_prefix_caching)")
        if self.world_size > 1:
            raise ValueError("kv_disk_path: the disk KV tier is not supported with tensor/pipeline parallelism")
        self.kv_disk_path = os.path.abspath(os.fspath(self.kv_disk_path))
        try:  # fail now, naming the option, rather than on the first eviction
            os.makedirs(self.kv_disk_path, exist_ok=True)
            tempfile.TemporaryFile(dir=self.kv_disk_path).close()
        except OSError as e:
            raise ValueError(f"kv_disk_path: cannot write to {self.kv_disk_path!r}: {e}") from None
        if self.kv_disk_gb is None:
            self.kv_disk_gb = 10.0

    def kv_spec(self) -> KVSpec:
        """The KV-cache settings (what kvcache sizes and allocates from)."""
        return KVSpec(**{f.name: getattr(self, f.name) for f in fields(KVSpec)})

    def _check_memory(self) -> None:
        """Sizes in GiB asked for explicitly must fit the machine (the engine checks again, exactly,
        once the model is loaded and the block count is known)."""
        from ..kvcache.memory import check_fits

        if self.kv_cache_memory_gb is not None:
            check_fits(self.kv_cache_memory_gb * _GiB, self.torch_device, "kv_cache_memory_gb")
        host = self.cpu_offload_gb + (self.swap_space_gb if self.preemption_mode == "swap" else 0.0)
        if host:
            check_fits(host * _GiB, "cpu", "cpu_offload_gb" if self.cpu_offload_gb else "swap_space_gb")

    def parallel_spec(self) -> ParallelSpec:
        """The model-parallel settings (what distributed/ runs on)."""
        return ParallelSpec(self.tensor_parallel_size, self.pipeline_parallel_size, self.expert_parallel_size,
                            self.torch_device, self.torch_dtype, self.seed, self.distributed_timeout_s)

    @property
    def world_size(self) -> int:
        """Model-parallel ranks (processes) the engine runs on."""
        return self.parallel_spec().world_size

    @property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        return None if self.dtype is None else _DTYPES[self.dtype]

    @classmethod
    def split_kwargs(cls, kwargs: dict):
        """(EngineConfig, leftover kwargs) from a flat keyword dict."""
        names = {f.name for f in fields(cls)}
        mine = {k: v for k, v in kwargs.items() if k in names}
        return cls(**mine), {k: v for k, v in kwargs.items() if k not in names}


_GiB = 1 << 30


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device) -> torch.device:
    """The device an engine runs on: `device`, else cuda when present, else cpu."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
