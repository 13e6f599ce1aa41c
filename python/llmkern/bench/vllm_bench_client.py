"""`vllm bench serve` as an independent client of any OpenAI-compatible server: its random dataset
(fresh random prompts of a fixed length, EOS ignored) at one Poisson rate, its JSON result read back
into the row shape of loadgen.summarise_tpot (seconds), so both clients share one table."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from typing import List, Optional


def argv(exe: str, base: str, model: str, tokenizer: str, rate: float, num_prompts: int, result_dir: str,
         result_filename: str, input_len: int = 256, output_len: int = 64, seed: int = 0,
         slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.25) -> List[str]:
    # The seed must differ between runs on one server: its prefix cache would serve a repeated prompt.
    return [exe, "bench", "serve", "--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--ignore-eos",
            "--request-rate", str(rate), "--num-prompts", str(num_prompts), "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--goodput", f"ttft:{slo_ttft_s * 1e3:g}", f"tpot:{slo_tpot_s * 1e3:g}", "--disable-tqdm",
            "--save-result", "--result-dir", result_dir, "--result-filename", result_filename]


def _s(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else round(ms / 1e3, 4)


def parse(result: dict, system: str, rate: float) -> dict:
    """The row of one saved result (--save-result's JSON): latencies in seconds as our client's."""
    done = result.get("completed", 0)
    return {"system": system, "rate": rate, "requests": result.get("num_prompts", done + result.get("failed", 0)),
            "completed": done, "ttft_p50": _s(result.get("p50_ttft_ms")), "ttft_p99": _s(result.get("p99_ttft_ms")),
            "tpot_p50": _s(result.get("p50_tpot_ms")), "tpot_p99": _s(result.get("p99_tpot_ms")),
            "itl_p50": _s(result.get("p50_itl_ms")), "itl_p99": _s(result.get("p99_itl_ms")),
            "e2e_p50": _s(result.get("p50_e2el_ms")), "e2e_p99": _s(result.get("p99_e2el_ms")),
            "out_tok_s": round(result.get("output_throughput") or 0.0, 2),
            "goodput_rps": None if result.get("request_goodput") is None else round(result["request_goodput"], 3),
            "wall_s": None if result.get("duration") is None else round(result["duration"], 2)}


def run(exe: str, base: str, model: str, tokenizer: str, system: str, rate: float, num_prompts: int,
        timeout: float, env: Optional[dict] = None, **kw) -> dict:
    """One `vllm bench serve` run against base; its row (RuntimeError with its output's tail if it
    fails or writes no result)."""
    with tempfile.TemporaryDirectory(prefix="llmkern-vllm-bench-") as d:
        cmd = argv(exe, base, model, tokenizer, rate, num_prompts, d, "result.json", **kw)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"vllm bench serve: no result after {timeout:.0f} s") from None
        path = os.path.join(d, "result.json")
        if p.returncode != 0 or not os.path.exists(path):
            code = str(p.returncode)
            if p.returncode < 0:  # killed by a signal: name it (SIGILL: a CPU feature the build needs)
                code += f" ({signal.Signals(-p.returncode).name})"
            raise RuntimeError(f"vllm bench serve exited with {code}: {(p.stdout + p.stderr)[-1500:]}")
        with open(path) as f:
            return parse(json.load(f), system, rate)
