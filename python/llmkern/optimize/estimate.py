"""The performance estimate: a step-time model from the model's shape and a hardware profile, and a
replay of llmkern's continuous-batching schedule over a workload with that step time.

Step time (seconds) of a batch with D decode tokens and prefill chunks (len q_i over context c_i):
    overhead = step_overhead + seq_overhead x (sequences in the step)
    linear   = max(weight bytes / bandwidth, 2 x linear params x tokens / GEMM FLOP/s)
               + 2 x vocab x hidden x (sequences that sample) / GEMM FLOP/s  (the LM head rows)
    attention = decode K/V bytes / decode attention rate + prefill attention FLOPs / prefill rate
Weights are read once per step whatever the batch (memory bound at small batches); the LM head
runs only on the rows that sample (decodes and the last chunk of a prompt).

Not modelled (estimated as if off / as one engine): speculative decoding, tensor/pipeline/data
parallelism, preemption, the static and dynamic schedulers' batch waits, and the HTTP server's own
per-token work (SSE, detokenising), which on a CPU shares the cores with the engine."""
from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ..engine.metrics import percentile
from .profiles import HardwareProfile

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class ModelShape:
    """What the cost model needs from a model config."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype: str = "float32"

    @classmethod
    def from_config(cls, cfg, dtype: str = "float32") -> "ModelShape":
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype: expected one of {', '.join(_DTYPE_BYTES)}, got {dtype!r}")
        return cls(cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, cfg.vocab_size, dtype)

    @property
    def bytes_per_param(self) -> int:
        return _DTYPE_BYTES[self.dtype]

    @property
    def linear_params(self) -> int:
        """Parameters of the per-layer matmuls (attention projections + gated MLP), all layers."""
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2
        return self.layers * (attn + 3 * h * self.intermediate)

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Bytes read per step: every layer's matmul weights and the LM head."""
        return (self.linear_params + self.head_params) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param


def model_config(model: Optional[str]):
    """The ModelConfig of a model path (GGUF or HF directory; None: the embedded default), weights unread."""
    from ..models import loader

    path = os.fspath(model) if model is not None else loader.default_model_path()
    if not os.path.exists(path):
        raise ValueError(f"--model: {path!r} does not exist (expected a HF model directory or a .gguf file)")
    if path.endswith(".gguf"):
        return loader._open_gguf(path)[2]
    return loader.read_hf_config(os.path.join(path, "config.json") if os.path.isdir(path) else path)


@dataclass
class StepCost:
    """Seconds of one engine step, by part."""
    overhead: float
    linear: float
    attention: float

    @property
    def total(self) -> float:
        return self.overhead + self.linear + self.attention


def step_time(m: ModelShape, hw: HardwareProfile, decode_ctx: Sequence[int], prefill: Sequence[tuple],
              sampling_prefills: int = 0) -> StepCost:
    """decode_ctx: context length of each decoding sequence; prefill: (chunk length, context before
    the chunk) per prefilling sequence; sampling_prefills: how many of those finish their prompt."""
    tokens = len(decode_ctx) + sum(q for q, _ in prefill)
    nseq = len(decode_ctx) + len(prefill)
    if nseq == 0:
        return StepCost(0.0, 0.0, 0.0)
    gemm = hw.gemm(m.dtype)
    lin = max(m.weight_bytes / hw.bandwidth, 2 * m.linear_params * tokens / gemm)
    lin += 2 * m.head_params * (len(decode_ctx) + sampling_prefills) / gemm
    kv_read = m.kv_bytes_per_token * sum(c + 1 for c in decode_ctx)
    pre_flops = sum(4 * m.heads * m.head_dim * q * (c + (q + 1) / 2) for q, c in prefill) * m.layers
    attn = kv_read / hw.attn_decode_bw + pre_flops / hw.attn_prefill_flops
    return StepCost(hw.step_overhead_s + hw.seq_overhead_s * nseq, lin, attn)


@dataclass
class SimRequest:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefix_key: Optional[str] = None   # requests sharing a key share their first prefix_tokens tokens
    prefix_tokens: int = 0


@dataclass
class EngineKnobs:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    kv_cache_tokens: Optional[int] = None   # KV pool capacity (None: unlimited)
    max_concurrency: Optional[int] = None   # client-side cap on requests in flight

    @classmethod
    def from_knobs(cls, knobs: Dict[str, object], kv_cache_tokens: Optional[int] = None) -> "EngineKnobs":
        k = cls(kv_cache_tokens=kv_cache_tokens)
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if knobs.get(name) is not None:
                setattr(k, name, int(knobs[name]))
        if knobs.get("max_batch_size") is not None:
            k.max_num_seqs = int(knobs["max_batch_size"])
        if knobs.get("chunked_prefill") is False:
            k.enable_chunked_prefill = False
        if knobs.get("prefix_caching") is False:
            k.enable_prefix_caching = False
        if knobs.get("max_concurrency") is not None:
            k.max_concurrency = int(knobs["max_concurrency"])
        return k


class _Seq:
    __slots__ = ("r", "idx", "computed", "todo", "out", "first", "last", "itls", "sent")

    def __init__(self, r: SimRequest, idx: int, sent: float, cached: int):
        self.r, self.idx, self.sent = r, idx, sent
        self.computed = cached                      # prompt tokens in the KV cache
        self.todo = r.prompt_tokens - cached        # prompt tokens still to compute
        self.out, self.first, self.last, self.itls = 0, None, None, []


def simulate(reqs: Sequence[SimRequest], m: ModelShape, hw: HardwareProfile, k: EngineKnobs) -> dict:
    """Replay the continuous-batching schedule (decodes first, then chunked prefills of running then
    waiting sequences under the token budget and sequence cap) with modelled step times. Returns
    the serving metrics under the database's names plus per-request rows."""
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    pending = [(reqs[i].arrival, i) for i in order]          # (time the client sends it, index)
    heapq.heapify(pending)
    in_flight_cap = k.max_concurrency or len(reqs) or 1
    in_flight = 0
    slot_free = [0.0] * min(in_flight_cap, max(len(reqs), 1))   # when each client slot frees (a heap)
    waiting: List[_Seq] = []
    running: List[_Seq] = []
    cached_prefixes: set = set()
    done: List[_Seq] = []
    t = 0.0
    steps = 0
    budget_cap = k.max_num_batched_tokens if k.enable_chunked_prefill else max(
        k.max_num_batched_tokens, max((r.prompt_tokens for r in reqs), default=1))
    while pending or waiting or running:
        while pending and pending[0][0] <= t and in_flight < in_flight_cap:
            sent, i = heapq.heappop(pending)
            r = reqs[i]
            cached = 0
            if k.enable_prefix_caching and r.prefix_key is not None and r.prefix_key in cached_prefixes:
                cached = min((r.prefix_tokens // k.block_size) * k.block_size, r.prompt_tokens - 1)
            waiting.append(_Seq(r, i, max(sent, heapq.heappop(slot_free)), cached))
            in_flight += 1
        if not waiting and not running:
            if pending and in_flight < in_flight_cap:
                t = max(t, pending[0][0])
            continue
        budget = budget_cap
        decodes, prefills = [], []
        for s in running:
            if budget <= 0:
                break
            if s.todo == 0:
                decodes.append(s)
                budget -= 1
            else:
                n = min(s.todo, budget)
                prefills.append((s, n))
                budget -= n
        kv_used = sum(s.computed + s.out for s in running)
        while waiting and budget > 0 and len(running) < k.max_num_seqs:
            s = waiting[0]
            if k.kv_cache_tokens is not None and kv_used + s.r.prompt_tokens + s.r.output_tokens > k.kv_cache_tokens \
                    and running:
                break
            n = s.todo
            if n > budget:
                if not k.enable_chunked_prefill:
                    break
                n = budget
            waiting.pop(0)
            running.append(s)
            prefills.append((s, n))
            budget -= n
            kv_used += s.r.prompt_tokens
        finishing = sum(1 for s, n in prefills if n == s.todo)
        cost = step_time(m, hw, [s.computed + s.out for s in decodes], [(n, s.computed) for s, n in prefills],
                         finishing)
        t += cost.total
        steps += 1
        for s in decodes:
            s.out += 1
            s.itls.append(t - s.last)
            s.last = t
        for s, n in prefills:
            s.todo -= n
            s.computed += n
            if s.todo == 0:
                if s.r.prefix_key is not None:
                    cached_prefixes.add(s.r.prefix_key)
                s.out, s.first, s.last = 1, t, t
        for s in [s for s in running if s.todo == 0 and s.out >= s.r.output_tokens]:
            running.remove(s)
            s.last = t
            done.append(s)
            in_flight -= 1
            heapq.heappush(slot_free, t)
    done.sort(key=lambda s: s.idx)
    return summarise(done, t, steps)


def summarise(done: List[_Seq], end: float, steps: int) -> dict:
    ttft = [s.first - s.sent for s in done]
    itl = [x for s in done for x in s.itls]
    e2e = [s.last - s.sent for s in done]
    start = min((s.sent for s in done), default=0.0)
    wall = max(end - start, 1e-9)
    out_toks = sum(s.out for s in done)
    prompt_toks = sum(s.r.prompt_tokens for s in done)
    res: Dict[str, object] = {"output_throughput": out_toks / wall, "total_throughput": (out_toks + prompt_toks) / wall,
                              "request_throughput": len(done) / wall, "duration": wall, "steps": steps}
    for name, xs in (("ttft", ttft), ("itl", itl), ("e2e_latency", e2e)):
        res[f"{name}_mean"] = sum(xs) / len(xs) if xs else None
        res[f"{name}_median"] = percentile(xs, 50)
        res[f"{name}_p95"] = percentile(xs, 95)
        res[f"{name}_p99"] = percentile(xs, 99)
    res["requests"] = [{"ttft": s.first - s.sent, "e2e_latency": s.last - s.sent,
                        "itl_mean": (sum(s.itls) / len(s.itls)) if s.itls else None} for s in done]
    return res


def kv_cache_tokens(m: ModelShape, kv_cache_memory_gb: float) -> int:
    return int(kv_cache_memory_gb * 2**30 // m.kv_bytes_per_token)


def concurrency_estimate(m: ModelShape, hw: HardwareProfile, concurrency: int, input_len: int, output_len: int,
                         knobs: Optional[EngineKnobs] = None, kv_cache_memory_gb: Optional[float] = None,
                         num_requests: Optional[int] = None) -> dict:
    """`llmkern estimate`: step times, TTFT/ITL/throughput with `concurrency` clients each sending
    its next request when the last finishes, and the concurrency limits."""
    if concurrency < 1 or input_len < 1 or output_len < 1:
        raise ValueError("concurrency, input_len and output_len must be >= 1")
    knobs = knobs or EngineKnobs()
    kv_gb = kv_cache_memory_gb if kv_cache_memory_gb is not None else (2.0 if hw.device == "cpu"
                                                                        else hw.memory_gb * 0.85 - m.weight_bytes / 2**30)
    knobs.kv_cache_tokens = kv_cache_tokens(m, max(kv_gb, 0.0))
    knobs.max_concurrency = concurrency
    n = num_requests or 4 * concurrency
    sim = simulate([SimRequest(0.0, input_len, output_len) for _ in range(n)], m, hw, knobs)
    ctx = input_len + output_len // 2
    decode_1 = step_time(m, hw, [ctx], []).total
    decode_c = step_time(m, hw, [ctx] * min(concurrency, knobs.max_num_seqs), []).total
    chunk = min(input_len, knobs.max_num_batched_tokens)
    prefill_steps = math.ceil(input_len / knobs.max_num_batched_tokens) if knobs.enable_chunked_prefill else 1
    prefill = sum(step_time(m, hw, [], [(min(chunk, input_len - i * chunk), i * chunk)],
                            int(i == prefill_steps - 1)).total for i in range(prefill_steps))
    # Decode is bandwidth bound until the batch's matmul time reaches the weight-read time.
    compute_c = m.weight_bytes / hw.bandwidth / (2 * m.linear_params / hw.gemm(m.dtype))
    kv_c = knobs.kv_cache_tokens // (input_len + output_len)
    sim.pop("requests")
    return {"model_weight_gb": m.weight_bytes / 2**30, "kv_bytes_per_token": m.kv_bytes_per_token,
            "prefill_time": prefill, "decode_step_time_batch1": decode_1, "decode_step_time": decode_c,
            "limits": {"kv_memory_concurrency": kv_c, "compute_bound_batch": compute_c,
                       "bandwidth_decode_tok_s_batch1": 1.0 / decode_1,
                       "max_num_seqs": knobs.max_num_seqs},
            "at_concurrency": dict(sim, concurrency=concurrency)}
