"""Run a peer library's own test suite against llmkern's import-compatible modules.

    python bench/peer_suites.py flash-attn PATH/TO/flash-attention [--backend cpu|simt]
        [--sample N] [--seed S] [-k EXPR] [--json OUT.json] [--timeout SECONDS]
    python bench/peer_suites.py flashinfer PATH/TO/flashinfer ...
    python bench/peer_suites.py vllm PATH/TO/vllm ...

PATH is a checkout the user provides (nothing is downloaded). The suite's test files are copied
into a temporary directory with only device and size substitutions (listed in the report), next
to a conftest (bench/peer_shims/peer_conftest.py) that aliases the peer's modules to llmkern.compat.*;
pytest runs there and every test is reported as passed, failed or skipped, with failures that
need what llmkern does not do (backward, dropout, private C++ entry points) counted separately
as out of scope. ``--sample N`` keeps N cases per test function (a fixed, seeded draw; 0 = all):
the full parametrizations run to hundreds of thousands of cases.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO_PY = HERE.parent / "python"


def _package_root() -> str:
    """Where the llmkern that this interpreter imports lives (site-packages for an installed wheel,
    the source tree's python/ for a development build), so the peer's tests run against it."""
    import importlib.util

    spec = importlib.util.find_spec("llmkern")
    return str(Path(spec.origin).parent.parent) if spec and spec.origin else str(REPO_PY)

# Device: every "cuda" / "cuda:N" literal names the CPU (the simt backend also runs on CPU
# tensors; the conftest routes the kernels).
DEVICE_SUBS: List[Tuple[str, str]] = [
    (r"""(["'])cuda(:\d+)?\1""", '"cpu"'),
    (r"""f"cuda:\{i\}\"""", '"cpu"'),
    (r"\.to\(0\)", '.to("cpu")'),  # device index 0 = the first GPU
]


@dataclass
class Suite:
    files: List[str]
    size_subs: List[Tuple[str, str]] = field(default_factory=list)
    # (function name, params, failed source line, error) -> out-of-scope reason or None
    out_of_scope: Callable[[str, Dict[str, str], str, str], Optional[str]] = lambda *a: None


_FA_BACKWARD_ONLY = {"test_flash_attn_bwd_overflow", "test_flash_attn_bwd_transpose",
                     "test_flash_attn_bwd_varlen_overflow", "test_flash_attn_deterministic",
                     "test_flash_attn_varlen_deterministic"}
_FA_PRIVATE = {"test_flash_attn_varlen_paged_kv_num_splits": "private _flash_attn_varlen_forward",
               "test_flash_attn_generator_arg_must_be_none": "private flash_attn_gpu C++ entry points"}
_GRAD_NAMES = re.compile(r"\bd(q|k|v|qkv|kv)(_ref|_pt|_unpad)?\b")


def _fa_scope(fn: str, params: Dict[str, str], line: str, error: str) -> Optional[str]:
    if fn in _FA_BACKWARD_ONLY:
        return "backward"
    if fn in _FA_PRIVATE:
        return "private API (" + _FA_PRIVATE[fn] + ")"
    try:
        if float(params.get("dropout_p", "0")) > 0:
            return "dropout"
    except ValueError:
        pass
    if line and _GRAD_NAMES.search(line):
        return "backward (forward assertions passed)"
    return None


_VLLM_NOT_KERNELS = {"test_rope_module_cache": "get_rope's module cache (vLLM Python, not a kernel)"}
_FP8 = re.compile(r"fp8|float8|e4m3|e5m2|nvfp4", re.I)


def _vllm_scope(fn: str, params: Dict[str, str], line: str, error: str) -> Optional[str]:
    if fn in _VLLM_NOT_KERNELS:
        return _VLLM_NOT_KERNELS[fn]
    if _FP8.search(params.get("kv_cache_dtype", "")) or "quant" in fn or "fp8" in error:
        return "fp8 (llmkern caches and norms are fp32/fp16/bf16)"
    if "mla" in fn.lower():
        return "MLA caches"
    if error.startswith("AttributeError") and ("vllm_ops" in error or "namespace" in error.lower()):
        return "op not provided by llmkern"
    return None


# CUDA-only machinery the tests drive around the API under test: streams and graph capture, or a
# fresh interpreter (which has none of the conftest's aliases) running torch.compile + CUDA graphs.
_CUDA_ONLY = re.compile(r"torch\.cuda\.(Stream|CUDAGraph|graph)|requires CUDA support|"
                        r"No module named 'flashinfer'")


def _flashinfer_scope(fn: str, params: Dict[str, str], line: str, error: str) -> Optional[str]:
    if any(_FP8.search(v) for v in params.values()) or _FP8.search(error) or "nvfp4" in fn:
        return "fp8 / fp4 KV cache"
    if "custom_mask" in error or "prefix_len_ptr" in error:  # multi-item scoring is a mask too
        return "multi-item scoring / bit-packed custom masks (boolean custom_mask runs)"
    if _CUDA_ONLY.search(line) or _CUDA_ONLY.search(error):
        return "CUDA streams / graph capture / torch.compile in a subprocess (no CUDA device in the run)"
    if "head_dim must be a multiple of 8 in [8, 256]" in error:
        return "head_dim > 256 (llmkern's attention kernels stop at 256)"
    if "head_dim_vo" in error or "mla" in fn.lower():
        return "MLA (head_dim_vo != head_dim_qk)"
    if any(v.strip("'\"") in ("trtllm-gen", "cudnn", "cutile", "fa3", "cutlass") for v in params.values()):
        return "another FlashInfer backend"
    return None


# A suite file may sit at one of several paths ("new|old"): peers move their tests around.
SUITES: Dict[str, Suite] = {
    "flash-attn": Suite(
        files=["tests/test_flash_attn.py"],
        # Longest contexts of the kvcache test: 128k / 20k keys -> 4k / 2k on a CPU.
        size_subs=[(r"128 \* 1024", "4 * 1024"), (r"\b20000\b", "2000")],
        out_of_scope=_fa_scope,
    ),
    "flashinfer": Suite(
        files=["tests/utils/test_sampling.py|tests/test_sampling.py",
               "tests/attention/test_batch_decode_kernels.py|tests/test_batch_decode_kernels.py",
               "tests/attention/test_batch_prefill_kernels.py|tests/test_batch_prefill_kernels.py",
               "tests/attention/test_single_prefill.py|tests/test_single_prefill.py",
               # single decode / prefill (and batch) with soft cap, sliding window, ALiBi
               "tests/attention/test_logits_cap.py|tests/test_logits_cap.py",
               "tests/attention/test_sliding_window.py|tests/test_sliding_window.py",
               "tests/attention/test_alibi.py|tests/test_alibi.py"],
        # Sampling: 5M draws over a 128k vocabulary -> 200k over 1k (about 200 draws a bin, so
        # the frequency checks keep their power); attention: 16k-key contexts -> 1k.
        size_subs=[(r"\b5_?000_?000\b", "200000"), (r"\b128256\b", "1024"), (r"\b32000\b", "512"),
                   (r"\b16384\b", "1024")],
        out_of_scope=_flashinfer_scope,
    ),
    "vllm": Suite(
        files=["tests/kernels/attention/test_cache.py|tests/kernels/test_cache.py",
               "tests/kernels/core/test_layernorm.py|tests/kernels/test_layernorm.py",
               "tests/kernels/core/test_pos_encoding.py|tests/kernels/test_pos_encoding.py",
               "tests/kernels/core/test_rotary_embedding.py",
               "tests/kernels/moe/test_moe_align_block_size.py",
               "tests/kernels/moe/test_fused_topk.py"],
        # vLLM sizes its caches for GPUs: 10000 blocks x 256 dims -> 1024 blocks on a CPU; rotary
        # over 5 x 8192 tokens x 17 heads -> 5 x 1024 (the simt emulator needs minutes for 8192).
        size_subs=[(r"NUM_BLOCKS = \[1024, 10000\]", "NUM_BLOCKS = [1024]"),
                   (r"SEQ_LENS = \[11, 8192\]", "SEQ_LENS = [11, 1024]")],
        out_of_scope=_vllm_scope,
    ),
}


def prepare(suite_name: str, checkout: Path, work: Path) -> List[str]:
    """Copies the suite's files (substituted) and the shims into work/; returns the test paths."""
    suite = SUITES[suite_name]
    tests = []
    for alternatives in suite.files:
        src = next((checkout / rel for rel in alternatives.split("|") if (checkout / rel).exists()), None)
        if src is None:
            print(f"{suite_name}: {alternatives} not found in {checkout}: skipped", file=sys.stderr)
            continue
        rel = str(src.relative_to(checkout))
        text = src.read_text()
        for pat, rep in DEVICE_SUBS + suite.size_subs:
            text = re.sub(pat, rep, text)
        dst = work / Path(rel).name
        dst.write_text(text)
        tests.append(str(dst))
    if not tests:
        raise SystemExit(f"{suite_name}: none of {suite.files} found in {checkout} (is it a checkout of the peer?)")
    shutil.copy(HERE / "peer_shims" / "peer_conftest.py", work / "conftest.py")
    return tests


def run(suite_name: str, checkout: Path, backend: str, sample: int, seed: int, keyword: str,
        timeout: float, extra: List[str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"peer-{suite_name}-"))
    keep = bool(os.environ.get("PEER_SUITE_KEEP"))  # keep the temp dir (debugging the shims)
    try:
        tests = prepare(suite_name, checkout, work)
        sidecar = work / "records.json"
        env = dict(os.environ)
        env.update(PEER_SUITE_NAME=suite_name, PEER_SUITE_BACKEND=backend,
                   PEER_SUITE_SAMPLE=str(sample), PEER_SUITE_SEED=str(seed),
                   PEER_SUITE_SIDECAR=str(sidecar), PEER_SUITE_SHIMS=str(HERE / "peer_shims"),
                   PEER_SUITE_CHECKOUT=str(checkout))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
               "-o", "addopts=", "-W", "ignore", *tests, *extra]
        if keyword:
            cmd += ["-k", keyword]
        t0 = time.time()
        timed_out = False
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
            tail = f"exit status {proc.returncode}\n" + (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            timed_out = True
            tail = f"timed out after {timeout:.0f} s\n" + ((e.stdout or b"")[-2000:].decode(errors="replace")
                                                            if isinstance(e.stdout, bytes) else str(e.stdout or "")[-2000:])
        elapsed = time.time() - t0
        records: dict = {}
        if sidecar.exists():  # JSON lines; the last line of a test is its latest state
            for line in sidecar.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                records[rec.pop("nodeid")] = rec
        crashed = [n for n, r in records.items() if r.get("started") and "outcome" not in r]
        for n in crashed:  # the run stopped inside this test: a crash fails it, the timeout does not
            if timed_out:
                records[n].pop("started", None)
            else:
                records[n].update(outcome="failed", error="process died during the test", failed_line="")
        return summarise(suite_name, records, elapsed, tail)
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def summarise(suite_name: str, records: dict, elapsed: float, tail: str) -> dict:
    suite = SUITES[suite_name]
    cases = records.pop("__cases__", {}).get("cases", {})
    totals = {"cases": sum(cases.values()), "collected": len(records), "deselected": 0, "passed": 0, "failed": 0, "skipped": 0,
              "out_of_scope": 0, "not_run": 0}
    by_fn: Dict[str, Dict[str, int]] = {}
    oos_reasons: Dict[str, int] = {}
    failures = []
    tests = {}
    for nodeid, rec in records.items():
        fn = rec.get("function", nodeid)
        row = by_fn.setdefault(fn, {"cases": cases.get(fn, 0), "passed": 0, "failed": 0, "skipped": 0,
                                    "out_of_scope": 0})
        if rec.get("deselected"):
            totals["deselected"] += 1
            continue
        outcome = rec.get("outcome")
        if outcome is None:
            totals["not_run"] += 1
            continue
        status = outcome
        if outcome == "failed":
            reason = suite.out_of_scope(fn, rec.get("params", {}), rec.get("failed_line", ""), rec.get("error", ""))
            if reason:
                status = "out_of_scope"
                oos_reasons[reason] = oos_reasons.get(reason, 0) + 1
            else:
                failures.append({"test": nodeid, "line": rec.get("failed_line", ""), "error": rec.get("error", "")})
        totals[status] += 1
        row[status] += 1
        tests[nodeid] = status
    in_scope = totals["passed"] + totals["failed"]
    return {"suite": suite_name, "elapsed_s": round(elapsed, 1), "totals": totals,
            "in_scope_pass_rate": (totals["passed"] / in_scope) if in_scope else None,
            "out_of_scope_reasons": oos_reasons, "by_function": by_fn, "failures": failures,
            "tests": tests, "pytest_tail": tail,
            "substitutions": {"device": DEVICE_SUBS, "size": suite.size_subs}}


def print_report(rep: dict) -> None:
    t = rep["totals"]
    print(f"== {rep['suite']}: {t['cases']} parametrized cases, {t['collected']} collected (sampled), "
          f"{t['deselected']} deselected (-k), "
          f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, "
          f"{t['out_of_scope']} out of scope, {t['not_run']} not run ({rep['elapsed_s']} s)")
    if rep["in_scope_pass_rate"] is not None:
        print(f"   in-scope pass rate: {100 * rep['in_scope_pass_rate']:.1f}%")
    for reason, n in sorted(rep["out_of_scope_reasons"].items()):
        print(f"   out of scope: {n:6d}  {reason}")
    print(f"   {'test function':44s} {'cases':>7s} {'pass':>6s} {'fail':>6s} {'skip':>6s} {'oos':>6s}")
    for fn, row in sorted(rep["by_function"].items()):
        if row["passed"] + row["failed"] + row["skipped"] + row["out_of_scope"]:
            print(f"   {fn:44s} {row['cases']:7d} {row['passed']:6d} {row['failed']:6d} {row['skipped']:6d} "
                  f"{row['out_of_scope']:6d}")
    for f in rep["failures"][:20]:
        print(f"   FAIL {f['test']}\n        at: {f['line'][:150]}\n        {f['error'][:300]}")
    if len(rep["failures"]) > 20:
        print(f"   ... {len(rep['failures']) - 20} more failures (see --json)")
    if t["not_run"] or not t["collected"]:
        print("   pytest output (tail):\n" + rep["pytest_tail"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("checkout", type=Path, help="the peer's source checkout (provided by you)")
    ap.add_argument("--backend", choices=["cpu", "simt"], default="cpu")
    ap.add_argument("--sample", type=int, default=0, help="cases kept per test function (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-k", dest="keyword", default="", help="pytest -k expression")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--json", type=Path, help="write the full report (per-test outcomes) here")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args(argv)
    rep = run(a.suite, a.checkout.resolve(), a.backend, a.sample, a.seed, a.keyword, a.timeout, a.pytest_args)
    print_report(rep)
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1))
    return 0 if rep["totals"]["failed"] == 0 and rep["totals"]["collected"] else 1


if __name__ == "__main__":
    sys.exit(main())
