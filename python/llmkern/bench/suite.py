"""The benchmark registry and runner: which modules form `kernels` and `e2e`, the machine
description and limits measured in the same run, and the collected records.

    python -m llmkern.bench.suite [kernels|e2e|all] [--quick] [--device cpu|cuda] [--only NAMES]

Prints the table; `llmkern bench` (llmkern.bench.cli) also writes the JSON/Markdown/PNG report.
A module listed here but not present (not written yet, or not installed) is skipped with a
note; one that fails is reported with its error and the others still run.
"""
from __future__ import annotations

import gc
import importlib
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from typing import Callable, Iterable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402

from llmkern._build import cpu_flags, cpu_model  # noqa: E402
from llmkern.bench import common  # noqa: E402

# Known modules, in run order. New bench_*.py files are picked up too (see discover()).
REGISTRY = {
    "kernels": ["bench_cache_ops", "bench_attention", "bench_sampling"],
    "e2e": ["bench_e2e"],
}
SUITES = ("kernels", "e2e", "all")
# Unlisted modules go to e2e when their name says so (bench_spec*.py: speculative decoding in the
# runtime), else to kernels; a `SUITE = "..."` line in the module overrides the guess
# ("standalone": run only by its own command, e.g. `llmkern bench router`).
_E2E_WORDS = ("e2e", "spec", "ngram", "draft", "throughput", "runtime", "engine", "serve", "generate")


def _declared_suite(path: str) -> Optional[str]:
    """A module may say which suite it belongs to with a top-level `SUITE = "e2e"` line."""
    try:
        with open(path, encoding="utf-8") as f:
            m = re.search(r'^SUITE\s*=\s*["\'](kernels|e2e|standalone)["\']', f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def discover(bench_dir: str = HERE) -> dict:
    """{suite: [module names]}: the registry plus any other bench_*.py in bench_dir."""
    suites = {k: list(v) for k, v in REGISTRY.items()}
    known = {m for v in suites.values() for m in v}
    for fn in sorted(os.listdir(bench_dir)):
        name = fn[:-3]
        if not (fn.startswith("bench_") and fn.endswith(".py")) or name in known:
            continue
        group = _declared_suite(os.path.join(bench_dir, fn))
        if group == "standalone":  # several processes or long runs: its own command, not the suite
            continue
        if group is None:
            group = "e2e" if any(w in name for w in _E2E_WORDS) else "kernels"
        suites[group].append(name)
    return suites


def select(which: str = "all", only: Optional[Iterable[str]] = None, bench_dir: str = HERE) -> list:
    """[(suite, module)] to run: a suite (or all) and optional name filters ("attention", ...)."""
    if which not in SUITES:
        raise ValueError(f"which: expected one of {', '.join(SUITES)}, got {which!r}")
    suites = discover(bench_dir)
    groups = ["kernels", "e2e"] if which == "all" else [which]
    chosen = [(g, m) for g in groups for m in suites[g]]
    if only:
        only = [o.strip() for o in only if o.strip()]
        chosen = [(g, m) for g, m in chosen if any(o in m for o in only)]
    return chosen


# ---- machine description ---------------------------------------------------------------------
def _mem_total() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("torch", "numpy", "transformers", "tokenizers", "safetensors", "gguf", "matplotlib",
                "pytest-benchmark", "llama-cpp-python"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        import llmkern

        out["llmkern"] = llmkern.__version__
    except Exception:  # noqa: BLE001 - the run reports the failure itself
        pass
    return out


def _gpu_info() -> list:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"name": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                     "memory_gib": round(p.total_memory / 2**30, 1)})
    try:  # clocks and driver are only visible through nvidia-smi
        q = "name,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,driver_version"
        res = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        for g, line in zip(gpus, res.stdout.strip().splitlines()):
            vals = [v.strip() for v in line.split(",")]
            if len(vals) == 7:
                g.update(sm_clock_mhz=vals[1], max_sm_clock_mhz=vals[2], mem_clock_mhz=vals[3],
                         max_mem_clock_mhz=vals[4], power_limit_w=vals[5], driver=vals[6])
    except (OSError, subprocess.SubprocessError):
        pass
    return gpus


def machine_info() -> dict:
    """What the figures were measured on (no measurement here; see machine_limits)."""
    info = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "llc_bytes": common.llc_bytes(),
        "memory_bytes": _mem_total(),
        "platform": platform.platform(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpus": _gpu_info(),
        "versions": _versions(),
    }
    try:
        import llmkern

        bi = llmkern.build_info()
        info.update(simd=bi.get("cpu_simd"), simd_supported=bi.get("cpu_simd_supported"),
                    simd_compiled=bi.get("cpu_simd_compiled"), cpu_kernels=bi.get("cpu_kernels"),
                    cpu_flags=cpu_flags(), llmkern_threads=bi.get("num_threads"),
                    llmkern_backends=bi.get("backends"), cuda_archs=bi.get("cuda_archs"))
    except Exception as e:  # noqa: BLE001
        info["llmkern_error"] = f"{type(e).__name__}: {e}"
    return info


def machine_limits(device: str = "cpu") -> dict:
    """Memory bandwidth and matmul FLOP/s measured now, with the same (cached) functions the
    benchmark modules use for their "% of limit" figures."""
    lim = {"device": device,
           "copy_bandwidth_Bps": common.copy_bandwidth(device),
           "read_bandwidth_Bps": common.read_bandwidth(device)}
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device.startswith("cuda") else [])
    for dt in dtypes:
        lim[f"matmul_{str(dt).split('.')[-1]}_flops"] = common.matmul_flops(dt, device)
    return lim


# ---- running ---------------------------------------------------------------------------------
def run_module(name: str, quick: bool, device: str, bench_dir: str = HERE) -> tuple:
    """(status, records, note): status is ok, skipped (module absent) or error."""
    if not os.path.exists(os.path.join(bench_dir, name + ".py")):
        return "skipped", [], f"{name}.py is not present in this build"
    try:
        # this package's modules by their package name; another folder's (a test's) from sys.path
        same = os.path.abspath(bench_dir) == HERE
        mod = importlib.import_module(f"llmkern.bench.{name}" if same else name)
    except SystemExit as e:
        return "skipped", [], str(e.code)
    except Exception as e:  # noqa: BLE001 - e.g. an op the module needs is not built
        return "error", [], f"import failed: {type(e).__name__}: {e}"
    if not hasattr(mod, "run"):
        return "error", [], "module has no run(quick, device)"
    torch.manual_seed(0)
    try:
        records = list(mod.run(quick=quick, device=device))
    except SystemExit as e:  # a module that does not apply here says so and exits (e.g. GPU-only)
        return "skipped", [], str(e.code) if e.code not in (None, 0) else "the module declined to run here"
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - one module's failure must not end the run
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return "error", [], f"{type(e).__name__}: {e} (at {os.path.basename(tb.filename)}:{tb.lineno})"
    finally:
        gc.collect()
    bad = [r for r in records if not isinstance(r, common.Record)]
    if bad:
        return "error", [r for r in records if isinstance(r, common.Record)], \
            f"run() returned {len(bad)} objects that are not Records"
    return "ok", records, ""


def run_suite(which: str = "all", quick: bool = False, device: str = "cpu", only=None,
              log: Callable[[str], None] = print, bench_dir: str = HERE, measure_limits: bool = True,
              on_module: Optional[Callable[[dict], None]] = None) -> dict:
    """Run the chosen modules; returns the result dict that report.write_report renders.
    on_module(result so far) is called after each module (the CLI saves partial results)."""
    common.configure(quick=quick)
    chosen = select(which, only, bench_dir)
    t_start = time.time()
    result = {
        "schema": "llmkern-bench/1",
        "suite": which, "quick": quick, "device": device, "only": list(only or []),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t_start)),
        "machine": machine_info(),
        "limits": {}, "modules": [], "records": [],
    }
    if measure_limits:
        log(f"measuring machine limits on {device} ...")
        t0 = time.perf_counter()
        result["limits"] = machine_limits(device)
        lim = result["limits"]
        log(f"  copy {lim['copy_bandwidth_Bps'] / 1e9:.1f} GB/s, read {lim['read_bandwidth_Bps'] / 1e9:.1f} GB/s, "
            f"matmul fp32 {lim['matmul_float32_flops'] / 1e9:.0f} GFLOP/s ({time.perf_counter() - t0:.1f} s)")
    for group, name in chosen:
        log(f"[{group}] {name} ...")
        t0 = time.perf_counter()
        status, records, note = run_module(name, quick, device, bench_dir)
        dt = time.perf_counter() - t0
        log(f"  {status} in {dt:.1f} s, {len(records)} figures" + (f" - {note}" if note else ""))
        result["modules"].append({"name": name, "suite": group, "status": status, "seconds": round(dt, 2),
                                  "records": len(records), "note": note})
        result["records"].extend(records)
        if on_module is not None:
            on_module(result)
    result["elapsed_s"] = round(time.time() - t_start, 1)
    if hasattr(os, "getloadavg"):
        result["loadavg_end"] = list(os.getloadavg())
    return result


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="?", default="all", choices=SUITES)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated module name filters")
    a = ap.parse_args(argv)
    res = run_suite(a.which, a.quick, a.device, a.only.split(",") if a.only else None)
    common.print_records(res["records"])
    return 0 if all(m["status"] != "error" for m in res["modules"]) else 1


if __name__ == "__main__":
    sys.exit(main())
