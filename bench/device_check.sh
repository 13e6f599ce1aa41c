#!/usr/bin/env bash
# GPU check of llmkern, in one go and under 8 minutes, on a CUDA machine without network access
# (torch, pybind11, scikit-build-core, cmake, ninja and nvcc preinstalled):
#   1. build the extension in-tree for this GPU's architecture only (plain CMake: no pip, no
#      build isolation, nothing downloaded),
#   2. the `cuda` tests (pytest -m cuda: the cuda params of the backend-parametrised tests and
#      the cuda-only tests, e.g. CUDA-graph capture),
#   3. compute-sanitizer memcheck and racecheck on bench/sanitize_kernels.py (every kernel once),
#   4. GPU benchmarks side by side with torch (llmkern/bench/bench_*.py --device cuda),
#   5. static SASS figures of the hd128 prefill and decode kernels (bench/sass_stats.py, sm_90a),
# writing device_check.log, stages.tsv, one JSON per benchmark and summary.json into OUT_DIR.
#
#   bash bench/device_check.sh [OUT_DIR]          (default: bench/results/)
#
# Every stage has its own time limit, cut further to what is left of the overall budget
# (LLMK_CHECK_BUDGET_S, default 465 s) less the time held back for the stages that must still
# run (RESERVE: the tests and sanitizers leave BENCH_RESERVE_S, default 150 s, to the GPU
# benchmarks, which switch to quick shapes when time is short); a failing or timed-out stage is
# recorded and the next one runs; the summary is always written and says how many CUDA tests
# ran, passed and failed. Without a GPU the GPU stages are skipped (dry run);
# LLMK_CHECK_DEVICE=cpu runs the benchmark drivers on the CPU to exercise the plumbing.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
OUT=${1:-bench/results}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
LOG=$OUT/device_check.log
STAGES=$OUT/stages.tsv
: >"$LOG"
: >"$STAGES"
rm -f "$OUT"/bench_*.json "$OUT"/sass_stats.json "$OUT"/pytest_cuda.xml "$OUT"/memcheck.log "$OUT"/racecheck.log "$OUT"/summary.json
T0=$(date +%s)
DEADLINE=$((T0 + ${LLMK_CHECK_BUDGET_S:-465}))
PY=${PYTHON:-python}
export PYTHONPATH="$ROOT/python:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
for d in /usr/local/cuda/bin /usr/local/cuda-13/bin; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH="$PATH:$d"
done
export PATH

log() { echo "[$(date +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }

# stage NAME CAP_S CMD...: runs CMD under `timeout`, limited to CAP_S and to the budget left
# (20 s kept for the summary, $RESERVE s for later stages); output goes to $STAGE_OUT (default:
# the main log).
RESERVE=0
BENCH_RESERVE=${BENCH_RESERVE_S:-150}
stage() {
  local name=$1 cap=$2
  shift 2
  local left=$((DEADLINE - $(date +%s) - 20 - RESERVE))
  if ((left < 10)); then
    log "SKIP  $name: time budget spent"
    printf '%s\tskipped\t0\tbudget\n' "$name" >>"$STAGES"
    return 0
  fi
  local lim=$((cap < left ? cap : left)) t rc status dest=${STAGE_OUT:-$LOG} cmd="$*"
  log "START $name (limit ${lim}s): ${cmd%%$'\n'*}"
  t=$(date +%s)
  timeout --kill-after=10 "$lim" "$@" >>"$dest" 2>&1
  rc=$?
  [[ $dest != "$LOG" ]] && cat "$dest" >>"$LOG"
  status=ok
  ((rc != 0)) && status=failed
  ((rc == 124 || rc == 137)) && status=timeout
  log "END   $name: $status (rc $rc, $(($(date +%s) - t))s)"
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t))" "$rc" >>"$STAGES"
  return 0
}

skip() {  # skip NAME REASON
  log "SKIP  $1: $2"
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >>"$STAGES"
}

summary() {
  trap - EXIT
  LLMK_OUT="$OUT" LLMK_T0="$T0" LLMK_ARCH="${ARCH:-}" "$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, re, time
import xml.etree.ElementTree as ET

out = os.environ["LLMK_OUT"]
s = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(os.environ["LLMK_T0"]))),
     "duration_s": int(time.time()) - int(os.environ["LLMK_T0"]), "arch": os.environ.get("LLMK_ARCH") or None}
try:
    s["environment"] = json.load(open(os.path.join(out, "env.json")))
except Exception:
    s["environment"] = None
s["stages"] = []
for line in open(os.path.join(out, "stages.tsv")):
    name, status, secs, rc = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
    s["stages"].append({"stage": name, "status": status, "seconds": int(secs or 0), "rc": rc})
try:
    root = ET.parse(os.path.join(out, "pytest_cuda.xml")).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    t = {k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")}
    t["passed"] = t["tests"] - t["failures"] - t["errors"] - t["skipped"]
    t["failed_ids"] = [f"{c.get('classname')}::{c.get('name')}" for x in suites for c in x.iter("testcase")
                       if c.find("failure") is not None or c.find("error") is not None]
    s["tests"] = t
except Exception as e:
    s["tests"] = f"no result ({type(e).__name__})"
for tool in ("memcheck", "racecheck"):
    try:
        text = open(os.path.join(out, f"{tool}.log")).read()
        m = re.findall(r"(ERROR|RACECHECK) SUMMARY: [^\n]*", text)
        s[tool] = m[-1] if m else "no summary line (see log)"
    except OSError:
        s[tool] = "not run"
try:
    s["sass"] = json.load(open(os.path.join(out, "sass_stats.json")))
except Exception:
    s["sass"] = None
s["benchmarks"] = {}
for f in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    try:
        s["benchmarks"][os.path.basename(f)[6:-5]] = json.load(open(f))
    except Exception as e:
        s["benchmarks"][os.path.basename(f)[6:-5]] = f"unreadable ({e})"

# The issue's targets, where the figures exist.
def find(bench, case_part, peer_part):
    for recs in s["benchmarks"].values():
        for r in recs if isinstance(recs, list) else []:
            if r["bench"] == bench and case_part in r["case"] and peer_part in r["peer"]:
                return r
tg = {}
r = find("attention/prefill causal", "1x4096 32/32x128", "flash")
if r: tg["prefill bf16 hd128 causal 4k vs SDPA flash (>= 1.0x)"] = r["ratio"]
r = find("attention/paged decode", "64x4096", "gather")
if r: tg["paged decode 64x4k: fraction of copy bandwidth (>= 0.8)"] = r["limit_fraction"]
for recs in s["benchmarks"].values():
    for r in recs if isinstance(recs, list) else []:
        if r["bench"].startswith("sampling") and re.match(r"64 x 12\d{4}\b", r["case"]) and "sort" in r["peer"]:
            tg[f"{r['bench']} {r['case']} vs {r['peer']} (>= 10x)"] = r["ratio"]
s["targets"] = tg
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1, default=str)
print("==== device check summary ====")
print(f"arch {s['arch']}, {s['duration_s']} s")
for st in s["stages"]:
    print(f"  {st['stage']:28} {st['status']:8} {st['seconds']:4d}s")
t = s["tests"]
if isinstance(t, str):
    print("  CUDA tests:", t)
else:
    print(f"  CUDA tests: {t['tests'] - t['skipped']} ran, {t['passed']} passed, {t['failures']} failed, "
          f"{t['errors']} errors (collection included), {t['skipped']} skipped")
    for fid in t["failed_ids"][:20]:
        print("    failed:", fid)
print("  memcheck:", s["memcheck"], "| racecheck:", s["racecheck"])
for k, v in tg.items():
    print(f"  target {k}: {v if v is None else round(v, 3)}")
print("summary:", os.path.join(out, "summary.json"))
EOF
}
trap summary EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ---- 0. environment ---------------------------------------------------------------------------
log "llmkern device check in $ROOT -> $OUT"
stage "nvidia-smi" 20 nvidia-smi
LLMK_OUT="$OUT" timeout 60 "$PY" - <<'EOF' >>"$LOG" 2>&1
import json, os, platform, shutil
import torch
e = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available(), "nvcc": shutil.which("nvcc")}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    e.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
             memory_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
json.dump(e, open(os.path.join(os.environ["LLMK_OUT"], "env.json"), "w"), indent=1)
print(json.dumps(e))
EOF
# This GPU's architecture: sm_90 gets 90a (the build's Hopper target), others their number.
ARCH=${LLMK_CHECK_ARCH:-$(timeout 60 "$PY" -c "
import torch
if torch.cuda.is_available():
    ma, mi = torch.cuda.get_device_capability(0)
    print(f'{ma}{mi}' + ('a' if (ma, mi) == (9, 0) else ''))" 2>>"$LOG")}
if [[ -z $ARCH ]] && command -v nvidia-smi >/dev/null; then
  cap=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ -n $cap ]] && ARCH=$cap && [[ $cap == 90 ]] && ARCH=90a
fi
HAVE_GPU=0
timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>>"$LOG" && HAVE_GPU=1
log "GPU present: $HAVE_GPU, arch: ${ARCH:-unknown}"

# ---- 1. build (in-tree, this arch only) -------------------------------------------------------
if [[ -n $ARCH ]] && command -v nvcc >/dev/null && { ((HAVE_GPU)) || [[ ${LLMK_CHECK_BUILD:-0} == 1 ]]; }; then
  PYBIND_DIR=$("$PY" -m pybind11 --cmakedir 2>>"$LOG")
  stage "configure" 60 cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMKERN_CUDA=ON \
    -DLLMKERN_CUDA_ARCHS="$ARCH" -DLLMKERN_SIMT=OFF -Dpybind11_DIR="$PYBIND_DIR" \
    -DPython_EXECUTABLE="$(command -v "$PY")"
  stage "build" 240 cmake --build build/device -j "$(nproc)"
  timeout 60 "$PY" -c "import llmkern, json; print('build_info', json.dumps(llmkern.build_info()))" >>"$LOG" 2>&1
else
  skip "build" "no GPU or no nvcc (set LLMK_CHECK_BUILD=1 and LLMK_CHECK_ARCH to build anyway)"
fi
BUILT=0
grep -q $'^build\tok' "$STAGES" && BUILT=1

# ---- 2. cuda tests ----------------------------------------------------------------------------
# From here on the benchmarks' share of the budget is held back.
((HAVE_GPU && BUILT)) && RESERVE=$BENCH_RESERVE
if ((HAVE_GPU && BUILT)); then
  stage "pytest -m cuda" 150 "$PY" -m pytest tests -m cuda -q -rfEs -p no:cacheprovider \
    --junitxml="$OUT/pytest_cuda.xml"
else
  skip "pytest -m cuda" "no GPU or no build"
fi

# ---- 3. compute-sanitizer -------------------------------------------------------------------------
SAN=$(command -v compute-sanitizer || true)
if [[ -z $SAN ]]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
    "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/x)")/compute-sanitizer"; do
    [[ -x $c ]] && SAN=$c && break
  done
fi
if ((HAVE_GPU && BUILT)) && [[ -n $SAN ]]; then
  STAGE_OUT=$OUT/memcheck.log stage "memcheck" 90 "$SAN" --tool memcheck --error-exitcode 1 \
    "$PY" bench/sanitize_kernels.py
  STAGE_OUT=$OUT/racecheck.log stage "racecheck" 120 "$SAN" --tool racecheck --error-exitcode 1 \
    "$PY" bench/sanitize_kernels.py
else
  skip "memcheck" "no GPU, no build or no compute-sanitizer"
  skip "racecheck" "no GPU, no build or no compute-sanitizer"
fi

# ---- 4. benchmarks ----------------------------------------------------------------------------
# The benchmark driver: runs MODULE.run(quick, device) and writes its records as JSON.
read -r -d '' DRIVER <<'EOF'
# bench driver
import json, sys, importlib
name, path, device, quick = sys.argv[1:5]
mod = importlib.import_module("llmkern.bench." + name)
from llmkern.bench.common import print_records
recs = mod.run(quick=quick == "1", device=device)
print_records(recs)
json.dump([r.as_dict() for r in recs], open(path, "w"), indent=1)
EOF
# spec = module:cap:reserve (seconds held back for the modules after it).
if ((HAVE_GPU && BUILT)); then
  # What a user's process decides on this GPU about the sm_90a prefill kernel (ops/sm90_check.py):
  # the benchmarks below then time whichever kernel it chose.
  RESERVE=120 stage "sm90_check" 60 "$PY" -c "
import sys, torch, llmkern
from llmkern.ops import sm90_check
cap = torch.cuda.get_device_capability()
why = sm90_check.check(llmkern._C, 'cuda') if cap == (9, 0) else 'not an sm_90 device'
print('sm90 check:', why or 'the sm_90a prefill kernel agrees with mma.sync: selected')
sys.exit(1 if cap == (9, 0) and why else 0)"
fi
if ((HAVE_GPU && BUILT)) || [[ ${LLMK_CHECK_DEVICE:-cuda} == cpu ]]; then
  for spec in bench_attention_gpu:170:75 bench_attention:60:45 bench_cache_ops:45:25 bench_sampling:60:0; do
    mod=${spec%%:*}
    cap=${spec#*:} && cap=${cap%%:*}
    RESERVE=${spec##*:}
    if [[ ! -f python/llmkern/bench/$mod.py ]]; then
      skip "$mod" "no llmkern/bench/$mod.py in this tree"
    elif [[ $mod == bench_attention_gpu && ${LLMK_CHECK_DEVICE:-cuda} != cuda ]]; then
      skip "$mod" "GPU-only benchmark"
    else
      quick=$(((DEADLINE - $(date +%s)) < 240 ? 1 : 0))  # quick shapes when under 4 minutes are left
      stage "$mod" "$cap" "$PY" -c "$DRIVER" "$mod" "$OUT/bench_${mod#bench_}.json" \
        "${LLMK_CHECK_DEVICE:-cuda}" "$quick"
    fi
  done
else
  skip "benchmarks" "no GPU or no build"
fi

# ---- 5. static SASS figures (no GPU needed: compiles for sm_90a; last, with what time is left;
# the hd128 prefill and the decode kernels only, the rest with `python bench/sass_stats.py`) ----
RESERVE=0
STAGE_OUT=$OUT/sass_stats.log stage "sass_stats" 240 "$PY" bench/sass_stats.py --jobs "$(nproc)" \
  --only prefill_hd128,prefill_sm90,decode --json "$OUT/sass_stats.json"
exit 0
