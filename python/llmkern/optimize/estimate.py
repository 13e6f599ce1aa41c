"""The performance estimate: a step-time model from the model's shape and a hardware profile, and a
replay of llmkern's continuous-batching schedule over a workload with that step time.

Step time (seconds) of a batch with D decode tokens and prefill chunks (len q_i over context c_i):
    overhead = step_overhead + seq_overhead x (sequences in the step)
    linear   = max(weight bytes / bandwidth, 2 x linear params x tokens / GEMM FLOP/s)
               + 2 x vocab x hidden x (sequences that sample) / GEMM FLOP/s  (the LM head rows)
    attention = decode K/V bytes / decode attention rate + prefill attention FLOPs / prefill rate
Weights are read once per step whatever the batch (memory bound at small batches); the LM head
runs only on the rows that sample (decodes and the last chunk of a prompt). A GGUF run quantised
reads its stored bytes and computes at the profile's "gguf" GEMM rate; a step of a few rows
reaches only a share of a GEMM rate measured at hundreds (decode_gemm_share, _rate). Both the
bandwidth a model's weights are read at and that share are fitted on the swept model itself
before a sweep (engine_calibration.py).

Tensor, pipeline and data parallelism: optimize/parallel.py. Not modelled (estimated as if off):
speculative decoding, preemption, the static and dynamic schedulers' batch waits, and the HTTP server's own
per-token work (SSE, detokenising), which on a CPU shares the cores with the engine."""
from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

from ..engine.metrics import percentile
from .parallel import ONE, Split, allreduce_time, kv_fraction, send_time
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
    # A GGUF run quantised (quantization "auto"): the projections' and LM head's bytes as stored
    # (0: dense in dtype), read by the quantised kernels at the profile's "gguf" GEMM rate.
    quant_linear_bytes: int = 0
    quant_head_bytes: int = 0

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
    def linear_bytes(self) -> int:
        return self.quant_linear_bytes or self.linear_params * self.bytes_per_param

    @property
    def head_bytes(self) -> int:
        return self.quant_head_bytes or self.head_params * self.bytes_per_param

    @property
    def weight_bytes(self) -> int:
        """Bytes read per step: every layer's matmul weights and the LM head."""
        return self.linear_bytes + self.head_bytes

    def dense(self) -> "ModelShape":
        """The shape with every weight in dtype (what model-parallel ranks load: they dequantise)."""
        return replace(self, quant_linear_bytes=0, quant_head_bytes=0)

    def gemm_rate(self, hw: HardwareProfile, quantised: bool) -> float:
        return hw.gemm("gguf") if quantised and "gguf" in hw.gemm_flops else hw.gemm(self.dtype)

    def with_stored_weights(self, model: Optional[str]) -> "ModelShape":
        """For a GGUF the engine runs quantised (quantization "auto"), the bytes it keeps as stored."""
        from ..models import loader

        path = os.fspath(model) if model is not None else loader.default_model_path()
        if not path.endswith(".gguf") or self.dtype == "float16":   # fp16 models are dequantised
            return self
        lin, head = loader.gguf_quantised_bytes(path)
        return replace(self, quant_linear_bytes=lin, quant_head_bytes=head)

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
    """Seconds of one engine step (a round: every scheduled sequence advances once), by part."""
    overhead: float
    linear: float
    attention: float
    comm: float = 0.0

    @property
    def total(self) -> float:
        return self.overhead + self.linear + self.attention + self.comm


def step_time(m: ModelShape, hw: HardwareProfile, decode_ctx: Sequence[int], prefill: Sequence[tuple],
              sampling_prefills: int = 0, split: Split = ONE) -> StepCost:
    """decode_ctx: context length of each decoding sequence; prefill: (chunk length, context before
    the chunk) per prefilling sequence; sampling_prefills: how many of those finish their prompt.
    split: the costs are those of one rank of the last pipeline stage (it holds the LM head), for
    one of up to pp micro-batches, times the pp slots a round takes (optimize/parallel.py)."""
    tokens = len(decode_ctx) + sum(q for q, _ in prefill)
    nseq = len(decode_ctx) + len(prefill)
    if nseq == 0:
        return StepCost(0.0, 0.0, 0.0)
    tp, pp = split.tp, split.pp
    mb = min(pp, nseq)                       # micro-batches
    if tp * pp > 1:
        m = m.dense()
        if hw.device == "cpu":
            # The ranks are processes on one machine, each with its share of the cores; memory
            # bandwidth is shared by the ranks at work at once (a pipeline with fewer micro-batches
            # than stages leaves some idle, and the busy one reads faster).
            r, rb = tp * pp, tp * mb
            hw = replace(hw, bandwidth=hw.bandwidth / rb, gemm_flops={k: v / r for k, v in hw.gemm_flops.items()},
                         attn_decode_bw=hw.attn_decode_bw / rb, attn_prefill_flops=hw.attn_prefill_flops / r)
    share = 1.0 / (tp * pp * mb)             # of the whole step's layer work, per rank and micro-batch
    samplers = (len(decode_ctx) + sampling_prefills) / mb
    stage_bytes = m.linear_bytes / (tp * pp) + m.head_bytes / tp
    rows = tokens / mb
    lin = max(stage_bytes / hw.bandwidth,
              2 * m.linear_params * tokens * share / _rate(m.gemm_rate(hw, bool(m.quant_linear_bytes)), hw, rows))
    lin += 2 * m.head_params / tp * samplers / _rate(m.gemm_rate(hw, bool(m.quant_head_bytes)), hw, samplers)
    kv_read = m.kv_bytes_per_token * kv_fraction(m.kv_heads, tp) / (pp * mb) * sum(c + 1 for c in decode_ctx)
    pre_flops = sum(4 * m.heads * m.head_dim * q * (c + (q + 1) / 2) for q, c in prefill) * m.layers * share
    attn = kv_read / hw.attn_decode_bw + pre_flops / hw.attn_prefill_flops
    act = tokens / mb * m.hidden * m.bytes_per_param        # one micro-batch's activations
    bw, lat = hw.link
    hop = send_time(act, bw, hw.stage_latency_s or lat) if pp > 1 else 0.0
    comm = 2 * m.layers / pp * allreduce_time(act, tp, bw, lat) + hop
    return StepCost(hw.step_overhead_s + hw.seq_overhead_s * nseq, pp * lin, pp * attn, pp * comm)


def _rate(peak: float, hw: HardwareProfile, rows: float) -> float:
    """A GEMM's FLOP/s at `rows` rows of activations. The profile's rate is measured at hundreds of
    rows; a decode step's few rows reach a share of it (per-pass costs not amortised): hw.extra's
    decode_gemm_share (fitted by engine_calibration) up to 16 rows, the whole rate from 256 rows,
    log-linear in between."""
    share = hw.extra.get("decode_gemm_share") if hw.extra else None
    if not share or rows >= 256:
        return peak
    if rows <= 16:
        return peak * share
    return peak * share ** (1 - math.log(rows / 16) / math.log(256 / 16))


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
    split: Split = ONE                      # tensor / pipeline / data parallel sizes
    decode_defer_steps: int = 0             # EngineConfig's: steps completing a prompt skip the decodes
    short_prompt_share: float = 0.5         # EngineConfig's: budget kept for short prompts beside a long one

    @classmethod
    def from_knobs(cls, knobs: Dict[str, object], kv_cache_tokens: Optional[int] = None) -> "EngineKnobs":
        k = cls(kv_cache_tokens=kv_cache_tokens)
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "decode_defer_steps"):
            if knobs.get(name) is not None:
                setattr(k, name, int(knobs[name]))
        if knobs.get("short_prompt_share") is not None:
            k.short_prompt_share = float(knobs["short_prompt_share"])
        if knobs.get("max_batch_size") is not None:
            k.max_num_seqs = int(knobs["max_batch_size"])
        if knobs.get("chunked_prefill") is False:
            k.enable_chunked_prefill = False
        if knobs.get("prefix_caching") is False:
            k.enable_prefix_caching = False
        if knobs.get("max_concurrency") is not None:
            k.max_concurrency = int(knobs["max_concurrency"])
        k.split = Split(*(int(knobs.get(f"{n}_parallel_size") or 1) for n in ("tensor", "pipeline", "data")))
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
    the serving metrics under the database's names plus per-request rows. With data parallelism
    the requests go round-robin (in arrival order) to k.split.dp replicas, the client's
    concurrency cap split between them."""
    d = k.split.dp
    if d == 1:
        done, t, steps = _replay(reqs, m, hw, k)
    else:
        order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
        kr = replace(k, max_concurrency=-(-k.max_concurrency // d) if k.max_concurrency else None)
        done, t, steps = [], 0.0, 0
        for r in range(d):
            idx = order[r::d]
            dn, tr, st = _replay([reqs[i] for i in idx], m, hw, kr)
            for s in dn:
                s.idx = idx[s.idx]
            done += dn
            t, steps = max(t, tr), max(steps, st)
    done.sort(key=lambda s: s.idx)
    return summarise(done, t, steps)


def _replay(reqs: Sequence[SimRequest], m: ModelShape, hw: HardwareProfile, k: EngineKnobs):
    """One replica's schedule: (finished sequences, end time, steps)."""
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
    deferred = 0
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
        reserve = _short_prompt_reserve(waiting, running, budget_cap, k)
        for s in running:
            if budget <= 0:
                break
            if s.todo == 0:
                decodes.append(s)
                budget -= 1
            else:
                n = min(s.todo, budget)
                if reserve and n > budget - reserve:
                    n = max(1, budget - reserve)   # a long prompt's chunk leaves room for short ones
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
        if decodes and finishing and deferred < k.decode_defer_steps and k.split.pp == 1:
            decodes, deferred = [], deferred + 1   # the scheduler's bounded decode deferral
        else:
            deferred = 0
        cost = step_time(m, hw, [s.computed + s.out for s in decodes], [(n, s.computed) for s, n in prefills],
                         finishing, k.split)
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
    return done, t, steps


def _short_prompt_reserve(waiting: List[_Seq], running: List[_Seq], budget: int, k: EngineKnobs) -> int:
    """The scheduler's _short_prompt_reserve: while a prompt is prefilled in chunks, the tokens of
    the waiting prompts at the head of the queue that fit whole into short_prompt_share of the budget."""
    share = int(budget * k.short_prompt_share)
    if not share or not k.enable_chunked_prefill or not waiting or not any(s.todo > 1 for s in running):
        return 0
    total = 0
    for s in waiting:
        if total + s.todo > share:
            break
        total += s.todo
    return total


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
    its next request when the last finishes, and the concurrency limits; knobs.split for tensor,
    pipeline and data parallelism (a GPU split whose weights do not fit raises ValueError)."""
    if concurrency < 1 or input_len < 1 or output_len < 1:
        raise ValueError("concurrency, input_len and output_len must be >= 1")
    knobs = knobs or EngineKnobs()
    sp = knobs.split
    bad = sp.invalid(m.heads, m.kv_heads, m.layers)
    if bad:
        raise ValueError(f"{sp}: {bad}")
    md = m.dense() if sp.tp * sp.pp > 1 else m
    dev_weights_gb = (md.linear_bytes / (sp.tp * sp.pp) + md.head_bytes / sp.tp) / 2**30
    if hw.device == "cpu":   # the engine's KV setting covers all of its ranks
        kv_gb = kv_cache_memory_gb if kv_cache_memory_gb is not None else 2.0
        knobs.kv_cache_tokens = kv_cache_tokens(m, max(kv_gb, 0.0))
    else:                    # per device: what the weights leave of the memory
        kv_gb = kv_cache_memory_gb if kv_cache_memory_gb is not None else hw.memory_gb * 0.85 - dev_weights_gb
        if kv_gb <= 0:
            raise ValueError(f"{sp}: the weights need {dev_weights_gb:.1f} GiB per device, more than 85% of "
                             f"{hw.name}'s {hw.memory_gb:g} GiB")
        per_token = m.kv_bytes_per_token * kv_fraction(m.kv_heads, sp.tp) / sp.pp
        knobs.kv_cache_tokens = int(kv_gb * 2**30 // per_token)
    knobs.max_concurrency = concurrency
    n = num_requests or 4 * concurrency
    sim = simulate([SimRequest(0.0, input_len, output_len) for _ in range(n)], m, hw, knobs)
    ctx = input_len + output_len // 2
    per_replica = -(-concurrency // sp.dp)
    decode_1 = step_time(m, hw, [ctx], [], split=sp).total
    decode_c = step_time(m, hw, [ctx] * min(per_replica, knobs.max_num_seqs), [], split=sp).total
    chunk = min(input_len, knobs.max_num_batched_tokens)
    prefill_steps = math.ceil(input_len / knobs.max_num_batched_tokens) if knobs.enable_chunked_prefill else 1
    prefill = sum(step_time(m, hw, [], [(min(chunk, input_len - i * chunk), i * chunk)],
                            int(i == prefill_steps - 1), sp).total for i in range(prefill_steps))
    # Decode is bandwidth bound until the batch's matmul time reaches the weight-read time.
    compute_c = md.weight_bytes / hw.bandwidth / (2 * md.linear_params / md.gemm_rate(hw, bool(md.quant_linear_bytes)))
    kv_c = knobs.kv_cache_tokens // (input_len + output_len)
    sim.pop("requests")
    return {"model_weight_gb": md.weight_bytes / 2**30, "kv_bytes_per_token": m.kv_bytes_per_token,
            "split": {"tp": sp.tp, "pp": sp.pp, "dp": sp.dp, "devices": sp.devices,
                      "weights_per_device_gb": dev_weights_gb},
            "prefill_time": prefill, "decode_step_time_batch1": decode_1, "decode_step_time": decode_c,
            "limits": {"kv_memory_concurrency": kv_c * sp.dp, "compute_bound_batch": compute_c,
                       "bandwidth_decode_tok_s_batch1": 1.0 / decode_1,
                       "max_num_seqs": knobs.max_num_seqs},
            "at_concurrency": dict(sim, concurrency=concurrency)}
