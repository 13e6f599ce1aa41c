"""Serving benchmark (`llmkern bench serve`, bench/bench_serve.py).

Starts each server as a subprocess on a free loopback port and drives it with an open-loop async
client: Poisson arrivals at several rates, a seeded mix of short chat turns and long-prompt
requests, streaming on, greedy. Per system and rate: TTFT / ITL / E2E p50-p95-p99, output tok/s and
goodput (requests per second that meet the SLO: TTFT <= slo_ttft_s and mean inter-token latency
<= slo_itl_s). Systems: `llmkern serve` with each scheduling policy (continuous, dynamic, static,
and continuous with the TTFT-SLO admission), and HF transformers' own OpenAI-compatible server
(`transformers serve --continuous-batching`) on the same weights. Also a burst of 32 requests
through the server against the same requests through LLM.generate in-process."""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from ..engine.metrics import percentile

_WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this from or "
          "had by word but what some we can out other were all there when up use your how said an each she "
          "which do their time if will way about many then them write would like so these her long make thing "
          "see him two has look more day could go come did number sound no most people my over know water than "
          "call first who may down side been now find any new work part take get place made live where after "
          "back little only round man year came show every good me give our under name very through just form "
          "sentence great think say help low line differ turn cause much mean before move right boy old too same "
          "tell does set three want air well also play small end put home read hand port large spell add even "
          "land here must big high such follow act why ask men change went light kind off need house picture "
          "try us again animal point mother world near build self earth father head stand own page should "
          "country found answer school grow study still learn plant cover food sun four between state keep eye "
          "never last let thought city tree cross farm hard start might story saw far sea draw left late run").split()


@dataclass
class Req:
    arrival: float
    prompt: str
    max_tokens: int
    extra: dict = field(default_factory=dict)   # more body fields (e.g. ignore_eos)


@dataclass
class Result:
    ok: bool = False
    ttft: Optional[float] = None
    itls: List[float] = field(default_factory=list)
    e2e: Optional[float] = None
    tokens: int = 0
    status: Optional[int] = None
    times: List[float] = field(default_factory=list)   # perf_counter() of each streamed token


def workload(n: int, rate: float, seed: int, long_frac: float = 0.2) -> List[Req]:
    """n requests, Poisson arrivals at `rate`/s: short chat turns (~20-100 words, 16-64 output
    tokens) and long-prompt requests (~300-500 words, 16-32 output tokens)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        long_ = rng.random() < long_frac
        words = rng.randint(300, 500) if long_ else rng.randint(20, 100)
        text = " ".join(rng.choice(_WORDS) for _ in range(words))
        prompt = ("Summarise this in one sentence: " if long_ else "Continue this story: ") + text
        out.append(Req(t, prompt, rng.randint(16, 32) if long_ else rng.randint(16, 64)))
    return out


async def _one(client, url: str, model: str, r: Req, t0: float, headers: dict, extra: Optional[dict] = None) -> Result:
    res = Result()
    await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
    start = t0 + r.arrival
    body = {"model": model, "messages": [{"role": "user", "content": r.prompt}], "max_tokens": r.max_tokens,
            "temperature": 0.0, "stream": True, **r.extra, **(extra or {})}
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if obj.get("error"):
                    return res
                choices = obj.get("choices") or []
                if not choices or not (choices[0].get("delta") or {}).get("content"):
                    continue
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itls.append(now - last)
                last = now
                res.tokens += 1   # one chunk per token while streaming (both servers)
                res.times.append(now)
        res.e2e = time.perf_counter() - start
        res.ok = res.ttft is not None
    except Exception:  # noqa: BLE001 - a failed request counts as not meeting the SLO
        pass
    return res


async def drive(base: str, model: str, reqs: List[Req], timeout: float, api_key: Optional[str] = None):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=len(reqs) + 4, max_keepalive_connections=len(reqs) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter() + 0.05
        tasks = [asyncio.ensure_future(_one(client, base + "/v1/chat/completions", model, r, t0, headers))
                 for r in reqs]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        results = [t.result() if t in done else Result() for t in tasks]
        return results, time.perf_counter() - t0


def summarise(system: str, rate: float, results: List[Result], wall: float, slo_ttft: float, slo_itl: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    itl = [x for r in ok for x in r.itls]
    e2e = [r.e2e for r in ok]
    good = [r for r in ok if r.ttft <= slo_ttft and (not r.itls or sum(r.itls) / len(r.itls) <= slo_itl)]

    def p(xs, q):
        v = percentile(xs, q)
        return None if v is None else round(v, 4)

    return {"system": system, "rate": rate, "requests": len(results), "completed": len(ok),
            "refused": sum(1 for r in results if r.status == 429),
            "ttft_p50": p(ttft, 50), "ttft_p95": p(ttft, 95), "ttft_p99": p(ttft, 99),
            "itl_p50": p(itl, 50), "itl_p95": p(itl, 95), "itl_p99": p(itl, 99),
            "e2e_p50": p(e2e, 50), "e2e_p95": p(e2e, 95), "e2e_p99": p(e2e, 99),
            "out_tok_s": round(sum(r.tokens for r in ok) / wall, 2), "goodput_rps": round(len(good) / wall, 3),
            "wall_s": round(wall, 2)}


# -- servers ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on a free loopback port, killed on close."""

    def __init__(self, name: str, argv: List[str], health: str = "/health", timeout: float = 300, env=None):
        import httpx

        self.name = name
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.log = tempfile.TemporaryFile("w+")
        from ..router.launch import _child_setup   # dies with this process even if it is SIGKILLed

        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env or os.environ.copy(),
                                     preexec_fn=_child_setup(None))
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{name}: exited with {self.proc.returncode}: {self.tail()}")
                try:
                    if httpx.get(self.base + health, timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        except BaseException:   # Ctrl-C while waiting: the caller never gets the object to close
            self.close()
            raise
        tail = self.tail()
        self.close()
        raise RuntimeError(f"{name}: not ready after {timeout} s: {tail}")

    def tail(self, n: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read()[-n:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def llmkern_argv(extra: List[str], model: Optional[str]) -> List[str]:
    return ([sys.executable, "-m", "llmkern.cli", "serve", "--port", "{port}", "--shutdown-grace-s", "0"]
            + (["--model", model] if model else []) + extra)


def hf_model_dir(path: str) -> str:
    """The embedded SmolLM2 weights and tokenizer as a HF directory (what `transformers serve` loads)."""
    from ..models.loader import default_model_path, read_gguf, save_hf_dir

    cfg, sd, tok = read_gguf(default_model_path())
    save_hf_dir(cfg, sd, path)
    tok.tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template,
                   "bos_token": tok.special_tokens.get("bos_token"), "eos_token": tok.special_tokens.get("eos_token"),
                   "add_bos_token": tok.add_bos, "model_max_length": cfg.max_position_embeddings}, f)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tok.eos_token_ids, "bos_token_id": tok.bos_token_id}, f)
    return path


# -- burst: server vs in-process ----------------------------------------------------------------------
def burst_ratio(base: str, model: str, n: int = 32, seed: int = 1, rounds: int = 2) -> dict:
    """n completions at once through the server vs LLM.generate in this process (same token-id
    prompts, greedy, fixed output lengths): output tok/s of each and the ratio. The two alternate
    for `rounds` rounds and the best of each counts (the machine may be shared)."""
    import httpx

    from ..engine import LLM, SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 49152) for _ in range(rng.randint(32, 128))] for _ in range(n)]
    outs = [rng.randint(32, 64) for _ in range(n)]

    async def server_once():
        async with httpx.AsyncClient(timeout=600) as c:
            async def one(p, m):
                r = await c.post(base + "/v1/completions", json={"model": model, "prompt": p, "max_tokens": m,
                                                                  "temperature": 0, "ignore_eos": True})
                return r.json()["usage"]["completion_tokens"]

            t0 = time.perf_counter()
            toks = await asyncio.gather(*[one(p, m) for p, m in zip(prompts, outs)])
            return sum(toks) / (time.perf_counter() - t0)

    llm = LLM()
    sps = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in outs]
    llm.generate(prompts[:2], sps[:2], use_tqdm=False)   # warm-up, as the server has had

    def inprocess_once():
        t0 = time.perf_counter()
        res = llm.generate(prompts, sps, use_tqdm=False)
        return sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)

    srv, inp = [], []
    for _ in range(rounds):
        srv.append(asyncio.run(server_once()))
        inp.append(inprocess_once())
    del llm
    return {"requests": n, "server_tok_s": round(max(srv), 2), "inprocess_tok_s": round(max(inp), 2),
            "ratio": round(max(srv) / max(inp), 3), "server_samples": [round(x, 2) for x in srv],
            "inprocess_samples": [round(x, 2) for x in inp]}


# -- report -------------------------------------------------------------------------------------------
def table(rows: List[dict]) -> str:
    cols = ["system", "rate", "completed", "refused", "ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p95",
            "itl_p99", "e2e_p50", "e2e_p95", "e2e_p99", "out_tok_s", "goodput_rps"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def plot(rows: List[dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    systems = sorted({r["system"] for r in rows}, key=lambda s: [x["system"] for x in rows].index(s))
    for s in systems:
        rs = sorted((r for r in rows if r["system"] == s), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        for ax, key in zip(axes, ("ttft_p95", "itl_p95", "e2e_p95", "goodput_rps")):
            ax.plot(x, [r[key] if r[key] is not None else float("nan") for r in rs], marker="o", label=s)
            ax.set_title(key.replace("_", " ") + (" (s)" if key != "goodput_rps" else " (req/s)"))
            ax.set_xlabel("request rate (req/s)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="request rates (req/s)")
    p.add_argument("--num-requests", type=int, default=24, help="requests per rate")
    p.add_argument("--policies", nargs="*", default=["continuous", "dynamic", "static", "continuous+slo"],
                   help="llmkern scheduling policies to run (none: only the peer)")
    p.add_argument("--max-batch-size", type=int, default=8, help="static/dynamic batch size")
    p.add_argument("--max-wait-ms", type=float, default=200.0)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-itl-s", type=float, default=0.2)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--no-peers", action="store_true", help="skip HF's `transformers serve`")
    p.add_argument("--no-burst", action="store_true", help="skip the burst-of-32 server vs in-process ratio")
    p.add_argument("--timeout", type=float, default=240.0, help="per (system, rate) run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results", help="folder for serve.json, serve.md, serve.png")


def _policy_args(policy: str, a) -> List[str]:
    if policy == "continuous":
        return ["--scheduler", "continuous", "--max-num-seqs", "32"]
    if policy == "continuous+slo":
        return ["--scheduler", "continuous", "--max-num-seqs", "32", "--slo-ttft-ms", str(1e3 * a.slo_ttft_s)]
    if policy == "dynamic":
        return ["--scheduler", "dynamic", "--max-batch-size", str(a.max_batch_size), "--max-wait-ms",
                str(a.max_wait_ms)]
    if policy == "static":
        return ["--scheduler", "static", "--max-batch-size", str(a.max_batch_size)]
    raise SystemExit(f"--policies: unknown policy {policy!r}")


def _save_partial(a, rows) -> None:
    with open(os.path.join(a.out, "serve.partial.json"), "w") as f:
        json.dump(rows, f, indent=1)


def _run_system(name, server, model, a, rows) -> None:
    # One request first: HF's continuous-batching manager starts (and warms up) on first use.
    asyncio.run(drive(server.base, model, [Req(0.0, "Hello", 8)], a.timeout))
    for rate in a.rates:
        reqs = workload(a.num_requests, rate, a.seed)
        results, wall = asyncio.run(drive(server.base, model, reqs, a.timeout))
        row = summarise(name, rate, results, wall, a.slo_ttft_s, a.slo_itl_s)
        rows.append(row)
        _save_partial(a, rows)
        print(f"[serve] {name} @ {rate} req/s: {row['completed']}/{row['requests']} done, TTFT p95 "
              f"{row['ttft_p95']} s, ITL p95 {row['itl_p95']} s, {row['out_tok_s']} tok/s, goodput "
              f"{row['goodput_rps']} req/s", file=sys.stderr, flush=True)


def quick_args() -> argparse.Namespace:
    """The settings of the suite's --quick run: one rate, few requests, continuous + the peer."""
    ap = argparse.ArgumentParser()
    add_args(ap)
    return ap.parse_args(["--rates", "0.5", "--num-requests", "8", "--policies", "continuous", "--no-burst",
                          "--out", tempfile.mkdtemp(prefix="llmkern-bench-serve-")])


def main(a) -> int:
    run_bench(a)
    return 0


def run_bench(a) -> dict:
    import signal
    import threading

    from ..models.loader import DEFAULT_MODEL_NAME

    if threading.current_thread() is threading.main_thread():   # SIGTERM still closes the servers
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    os.makedirs(a.out, exist_ok=True)
    rows: List[dict] = []
    report: Dict[str, object] = {"slo": {"ttft_s": a.slo_ttft_s, "itl_s": a.slo_itl_s}, "cpus": os.cpu_count(),
                                 "num_requests": a.num_requests, "rates": a.rates}
    model_name = DEFAULT_MODEL_NAME if a.model is None else os.path.basename(os.path.normpath(a.model))
    for policy in a.policies:
        srv = Server(f"llmkern-{policy}", llmkern_argv(_policy_args(policy, a), a.model))
        try:
            _run_system(f"llmkern {policy}", srv, model_name, a, rows)
            if policy == "continuous" and not a.no_burst:
                report["burst"] = burst_ratio(srv.base, model_name)
                print(f"[serve] burst-32: {report['burst']}", file=sys.stderr, flush=True)
        finally:
            srv.close()
    if not a.no_peers:
        report["peer"] = _run_hf_peer(a, rows)
    report["rows"] = rows
    ours = [r for r in rows if r["system"] == "llmkern continuous"]
    hf = [r for r in rows if r["system"].startswith("HF")]
    if ours and hf:
        report["goodput_ratio_vs_hf"] = {
            str(r["rate"]): (round(r["goodput_rps"] / h["goodput_rps"], 2) if h["goodput_rps"] else None)
            for r in ours for h in hf if h["rate"] == r["rate"]}
    md = table(rows)
    extra = []
    if "burst" in report:
        b = report["burst"]
        extra.append(f"burst of {b['requests']}: server {b['server_tok_s']} tok/s, in-process LLM.generate "
                     f"{b['inprocess_tok_s']} tok/s, ratio {b['ratio']}")
    if report.get("goodput_ratio_vs_hf"):
        extra.append(f"goodput llmkern continuous / HF server, per rate: {report['goodput_ratio_vs_hf']}")
    if isinstance(report.get("peer"), str):
        extra.append(f"HF peer: {report['peer']}")
    text = md + "\n\n" + "\n".join(extra) + "\n"
    print(text)
    with open(os.path.join(a.out, "serve.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write(text)
    plot(rows, os.path.join(a.out, "serve.png"))
    return report


def _run_hf_peer(a, rows) -> str:
    exe = shutil.which("transformers")
    if exe is None:
        return "not run: the `transformers` command is not installed"
    tmp = tempfile.mkdtemp(prefix="llmkern-hf-")
    try:
        path = hf_model_dir(tmp) if a.model is None else a.model
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        try:
            # The KV pool is bounded (1024 blocks of 32 tokens, ~1.5 GB for SmolLM2): sized on its own,
            # HF's continuous-batching cache took ~14 GB on the first long prompt here and was OOM-killed.
            srv = Server("HF transformers serve", [exe, "serve", "--continuous-batching", "--cb-block-size", "32",
                                                   "--cb-num-blocks", "1024", "--device", "cpu",
                                                   "--dtype", "float32", "--host", "127.0.0.1", "--port", "{port}",
                                                   path], env=env)
        except RuntimeError as e:
            print(f"[serve] HF peer did not start: {e}", file=sys.stderr)
            return f"not run: `transformers serve` did not start ({str(e)[-300:]})"
        try:
            _run_system("HF transformers serve (continuous batching)", srv, path, a, rows)
        finally:
            srv.close()
        return "ran"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    sys.exit(main(ap.parse_args()))
