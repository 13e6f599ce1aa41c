"""Calibrating the estimate on the swept model itself, before a sweep (about 30-60 s).

A machine profile's rates are those of streaming reads and square GEMMs. A real model's decode
step reads many small matrices between norms, rotary and sampling and reaches only part of the
streamed bandwidth; its prefill runs GEMMs of other shapes and the attention around them; and a
served step also pays the HTTP server's per-token work (detokenising, SSE), on a CPU on the same
cores. So the swept model itself is measured, with the configuration's dtype and quantisation:

- a prefill of a ~256-token prompt (time to its first token) -> the share of the profile's GEMM
  and prefill-attention rates a prefill reaches (prefill_scale);
- decode at 1 sequence -> the bandwidth this model's weights are read at (bandwidth_scale);
- decode at 8 sequences -> the share of the GEMM rate a decode step's few rows reach
  (decode_gemm_share; the profile's rate is measured at hundreds of rows).

For a serving workload all three go through `llmkern serve` (streaming, its per-token work
included), for an offline one through LLM.generate. The fit is kept apart from the machine's rates
(apply() combines them with the profile it was fitted against). Nothing from the sweep's own
requests is used."""
from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .estimate import ModelShape, step_time
from .profiles import HardwareProfile

_OUT = 48            # tokens per decode calibration request
_PREFILL_WORDS = 200  # words of the prefill calibration prompt (~256 tokens with the chat template)
_PROMPT = "Say something about the sea."
_REPEAT = 3           # measurements of each figure (their median: one run can catch a slow moment)


@dataclass
class Fit:
    """What calibrate_for_model fitted (scales of the machine profile's rates) and measured."""
    bandwidth_scale: float = 1.0
    prefill_scale: float = 1.0
    decode_gemm_share: Optional[float] = None
    measured: Dict[str, float] = field(default_factory=dict)

    def as_extra(self) -> Dict[str, float]:
        out = dict(self.measured, bandwidth_scale=self.bandwidth_scale, prefill_scale=self.prefill_scale)
        if self.decode_gemm_share is not None:
            out["decode_gemm_share"] = self.decode_gemm_share
        return out


def apply(hw: HardwareProfile, fit: Fit) -> HardwareProfile:
    """The machine profile hw with the model's fit applied."""
    extra = dict(hw.extra or {}, **fit.as_extra())
    return replace(hw, bandwidth=hw.bandwidth * fit.bandwidth_scale,
                   gemm_flops={k: v * fit.prefill_scale for k, v in hw.gemm_flops.items()},
                   attn_prefill_flops=hw.attn_prefill_flops * fit.prefill_scale, extra=extra)


def _median_itl(itls: Sequence[Sequence[float]]) -> float:
    xs = [x for seq in itls for x in seq[4:]]   # past the first steps (warm caches, batch formed)
    if not xs:
        raise RuntimeError("engine calibration: no inter-token latencies came back")
    return statistics.median(xs)


def _long_prompt() -> str:
    from ..loadgen.workload import words_text

    return "Summarise this: " + words_text(random.Random(7), _PREFILL_WORDS)


def _in_process(model: Optional[str], extra_engine: dict) -> Tuple[List[float], float, int]:
    """([ITL at 1, at 8 sequences], prefill TTFT, prefill prompt tokens)."""
    from ..engine import LLM, SamplingParams

    llm = LLM(model, **extra_engine)
    try:
        sp = SamplingParams(max_tokens=_OUT, temperature=0.0, ignore_eos=True)
        itls = []
        for n in (1, 8):
            llm.generate([_PROMPT] * n, [sp] * n, use_tqdm=False)      # warm-up at this batch
            runs = [llm.generate([_PROMPT] * n, [sp] * n, use_tqdm=False) for _ in range(_REPEAT)]
            itls.append(statistics.median(_median_itl([list(o.metrics.inter_token_latencies) for o in res])
                                          for res in runs))
        from ..models.loader import load_tokenizer

        ids = load_tokenizer(model).encode_chat([{"role": "user", "content": _long_prompt()}])
        one = SamplingParams(max_tokens=1, temperature=0.0)
        ttfts = []
        for i in range(1 + _REPEAT):   # distinct first tokens: no prefix-cache hit between the runs
            (o,) = llm.generate([[ids[0]] + [(ids[1] + i) % 1000 + 10] + ids[2:]], [one], use_tqdm=False)
            ttfts.append(o.metrics.ttft)
        return itls, statistics.median(ttfts[1:]), len(ids)
    finally:
        if getattr(llm, "shutdown", None):
            llm.shutdown()


def _served(model: Optional[str], serve_args: Sequence[str], timeout: float) -> Tuple[List[float], float, int]:
    from .. import loadgen
    from ..models.loader import load_tokenizer
    from ..procs import ServerProcess, llmkern_serve_argv

    name = "llmkern-calibration"
    srv = ServerProcess("llmkern serve", llmkern_serve_argv(["--served-model-name", name] + list(serve_args), model),
                        timeout=min(timeout, 300))

    def run(reqs):
        res, _ = asyncio.run(loadgen.drive(srv.base, name, reqs, timeout, extra={"ignore_eos": True}))
        if not all(r.ok for r in res):
            raise RuntimeError(f"engine calibration: the server failed a request: {srv.tail()}")
        return res

    try:
        itls = []
        for n in (1, 8):
            reqs = [loadgen.Req(0.0, _PROMPT, _OUT) for _ in range(n)]
            run(reqs)                                              # warm-up at this batch
            itls.append(statistics.median(_median_itl([r.itls for r in run(reqs)]) for _ in range(_REPEAT)))
        text = _long_prompt()
        ttfts = [run([loadgen.Req(0.0, f"{i} {text}", 1)])[0].ttft for i in range(1 + _REPEAT)]   # no cache hits
    finally:
        srv.close()
    ntok = len(load_tokenizer(model).encode_chat([{"role": "user", "content": "0 " + text}]))
    return itls, statistics.median(ttfts[1:]), ntok


def calibrate_for_model(hw: HardwareProfile, shape: ModelShape, model: Optional[str], extra_engine: dict,
                        serve_args: Optional[Sequence[str]] = None, timeout: float = 300.0) -> Fit:
    """Measure the swept model (through `llmkern serve` when serve_args is given, else in-process)
    and fit the scales that make the estimate's step model give back the measured times."""
    ctx = 24 + _OUT // 2
    where = "served" if serve_args is not None else "in_process"
    (t1, t8), ttft, ntok = _served(model, serve_args, timeout) if serve_args is not None else \
        _in_process(model, extra_engine)

    def fit(make, target: float, modelled, lo: float, hi: float) -> float:
        """The parameter in [lo, hi] (log-bisection) at which modelled(make(x)) == target; the
        modelled time falls as the parameter (a rate's scale) rises."""
        for _ in range(40):
            mid = (lo * hi) ** 0.5
            if modelled(make(mid)) > target:
                lo = mid
            else:
                hi = mid
        return (lo * hi) ** 0.5

    def decode(n):
        return lambda h: step_time(shape, h, [ctx] * n, []).total

    def prefill(h):
        return step_time(shape, h, [], [(ntok, 0)], 1).total

    f = Fit(measured={f"{where}_itl_1": t1, f"{where}_itl_8": t8, f"{where}_prefill_ttft": ttft,
                      "prefill_tokens": float(ntok)})
    for _ in range(4):   # each fit moves the others a little (e.g. the head's 1-row GEMM): alternate
        f.prefill_scale = fit(lambda s: apply(hw, replace(f, prefill_scale=s)), ttft, prefill, 1e-3, 8.0)
        f.bandwidth_scale = fit(lambda s: apply(hw, replace(f, bandwidth_scale=s)), t1, decode(1), 1e-3, 4.0)
        f.decode_gemm_share = fit(lambda s: apply(hw, replace(f, decode_gemm_share=s)), t8, decode(8), 1e-3, 4.0)
    return f
