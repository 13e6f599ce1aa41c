"""Static performance check of the CUDA attention kernels, no GPU needed: compile them for one
architecture (default sm_90a), read the SASS, and report per kernel

  - the main loop: of the innermost loops (backward branches) that hold tensor-core
    instructions (HMMA), the one with the most of them, then the fewest other instructions (the
    steady-state loop when a kernel keeps masked tiles apart), and in it the count of
    instructions that are not HMMA, per HMMA (static count: each instruction of the loop once);
  - registers, spill bytes (ptxas -v), static + dynamic shared memory per CTA, threads per CTA
    and the occupancy these allow (resident CTAs and warps per SM).

    python bench/sass_stats.py [--arch sm_90a] [--only prefill_hd128,decode] [--json PATH]
                               [--report DIR] [--cubin FILE ...]

--cubin reads already compiled cubins instead (e.g. another project's kernels, measured the same
way). --report DIR adds the table to the benchmark report in DIR (results.json, report.md).
Needs nvcc and cuobjdump (+ nvdisasm): from the CUDA toolkit, or the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")

# Translation units holding the attention kernels, by short name.
UNITS = {
    "prefill_hd64": "attention/flash_prefill_hd64.cu",
    "prefill_hd128": "attention/flash_prefill_hd128.cu",
    "prefill_hd256": "attention/flash_prefill_hd256.cu",
    "prefill_sm90": "attention/flash_prefill_sm90.cu",  # wgmma + TMA (sm_90a only; empty elsewhere)
    "decode": "attention/flash_decode.cu",
    "combine": "attention/flash_combine.cu",
}
NVCC_FLAGS = ["-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-std=c++17", "-Xptxas", "-v"]

# Per-SM limits of the architectures (CUDA programming guide, compute capabilities table).
SM_LIMITS = {
    "sm_80": dict(regs=65536, warps=64, ctas=32, smem=167936),
    "sm_86": dict(regs=65536, warps=48, ctas=16, smem=102400),
    "sm_89": dict(regs=65536, warps=48, ctas=24, smem=102400),
    "sm_90": dict(regs=65536, warps=64, ctas=32, smem=233472),
    "sm_90a": dict(regs=65536, warps=64, ctas=32, smem=233472),
}
SMEM_RESERVED_PER_CTA = 1024  # bytes the driver keeps per resident CTA (sm_80 and later)
TENSOR_OPS = ("HMMA", "HGMMA", "IMMA", "BMMA", "DMMA")


def find_tool(name: str) -> Optional[str]:
    """`name` on PATH, in the CUDA toolkit, or in an nvidia-* wheel (nvidia/cu*/bin)."""
    p = shutil.which(name)
    if p:
        return p
    cands = [f"/usr/local/cuda/bin/{name}"] + sorted(glob.glob(f"/usr/local/cuda-*/bin/{name}"))
    site = sysconfig.get_paths()["purelib"]
    cands += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", name)))
    cands += sorted(glob.glob(os.path.join(site, "nvidia", "*", "*", "bin", name)))
    return next((c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def tools() -> Dict[str, Optional[str]]:
    return {t: find_tool(t) for t in ("nvcc", "cuobjdump", "nvdisasm")}


def missing_tools(need_nvcc: bool = True) -> List[str]:
    t = tools()
    return [k for k, v in t.items() if v is None and (need_nvcc or k != "nvcc")]


# ---- SASS parsing ------------------------------------------------------------------------------
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


@dataclass
class Insn:
    addr: int
    op: str  # mnemonic with modifiers, e.g. HMMA.16816.F32.BF16
    text: str

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


def parse_sass(text: str) -> Dict[str, List[Insn]]:
    """cuobjdump -sass output -> {mangled function name: instructions}."""
    funcs: Dict[str, List[Insn]] = {}
    cur = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _INSN.match(line)
        if m and cur is not None:
            body = m.group(2).strip()
            toks = body.split()
            if toks and toks[0].startswith("@"):  # predicate guard
                toks = toks[1:]
            if toks:
                cur.append(Insn(int(m.group(1), 16), toks[0], body))
    return funcs


@dataclass
class Loop:
    start: int  # index of the first instruction
    end: int    # index of the backward branch
    hmma: int
    other: int
    hmma_equiv: float = 0.0  # tensor work in HMMA.16816 (m16n8k16) units per warp

    @property
    def per_hmma(self) -> Optional[float]:
        """Other instructions per unit of tensor work (per HMMA.16816-equivalent: an HGMMA
        m64nNk16 counts N/8, as each of its 4 warps does N/8 m16n8k16 products)."""
        return self.other / self.hmma_equiv if self.hmma_equiv else None


def hmma_units(ins: Insn) -> float:
    if ins.base == "HGMMA":
        m = re.match(r"HGMMA\.64x(\d+)x16", ins.op)
        return int(m.group(1)) / 8 if m else 1.0
    return 1.0 if ins.base in TENSOR_OPS else 0.0


def loops(insns: List[Insn]) -> List[Loop]:
    """Every backward branch closes a loop [target, branch]."""
    index = {ins.addr: i for i, ins in enumerate(insns)}
    out = []
    for i, ins in enumerate(insns):
        if ins.base not in ("BRA", "JMP"):
            continue
        m = re.search(r"\b(?:BRA|JMP)\S*\s+(?:`\(\S+\)\s*)?(0x[0-9a-f]+)", ins.text)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        if tgt > ins.addr or tgt not in index:
            continue
        body = insns[index[tgt]:i + 1]
        body = [b for b in body if b.base != "NOP"]
        h = sum(b.base in TENSOR_OPS for b in body)
        eq = sum(hmma_units(b) for b in body)
        out.append(Loop(index[tgt], i, h, len(body) - h, eq))
    return out


def main_loop(insns: List[Insn]) -> Optional[Loop]:
    """The innermost loops holding HMMA (none of them inside another); of those, the one with the
    most HMMA, then the fewest other instructions."""
    ls = [lp for lp in loops(insns) if lp.hmma]
    # A range holding an EXIT is a branch back from out-of-line code (e.g. an mbarrier wait's
    # retry placed after the epilogue), not a loop body: left out when real loops exist.
    real = [lp for lp in ls if not any(i.base == "EXIT" for i in insns[lp.start:lp.end + 1])]
    ls = real or ls
    ls = [lp for lp in ls if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in ls)]
    if not ls:
        return None
    top = max(lp.hmma for lp in ls)
    return min((lp for lp in ls if lp.hmma == top), key=lambda lp: lp.other)


# ---- resources ---------------------------------------------------------------------------------
def parse_ptxas(text: str) -> Dict[str, dict]:
    """ptxas -v output -> {mangled name: {regs, spill_stores, spill_loads, stack, smem_static}}."""
    res: Dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_][\w$]*)'?", line)
        if m:
            cur = res.setdefault(m.group(1), {"regs": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0,
                                              "smem_static": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem_static"] = int(s.group(1)) if s else 0
    return res


def parse_res_usage(text: str) -> Dict[str, dict]:
    """cuobjdump -res-usage -> {mangled name: {regs, smem_static, stack}} (cubins without a ptxas log)."""
    res: Dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", line)
        if m and cur:
            res[cur] = {"regs": int(m.group(1)), "stack": int(m.group(2)), "smem_static": int(m.group(3))}
    return res


def occupancy(arch: str, regs: int, threads: int, smem: int) -> dict:
    """Resident CTAs and warps per SM from registers (allocated per warp in units of 256),
    warps, CTA count and shared memory (plus the per-CTA reservation)."""
    lim = SM_LIMITS.get(arch, SM_LIMITS["sm_90a"])
    warps = max(1, (threads + 31) // 32)
    per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    by_regs = lim["regs"] // (per_warp * warps)
    by_warps = lim["warps"] // warps
    by_smem = lim["smem"] // (smem + SMEM_RESERVED_PER_CTA) if smem else lim["ctas"]
    ctas = min(by_regs, by_warps, by_smem, lim["ctas"])
    limiter = min((("registers", by_regs), ("warps", by_warps), ("shared memory", by_smem), ("CTAs", lim["ctas"])),
                  key=lambda kv: kv[1])[0]
    return {"ctas_per_sm": ctas, "warps_per_sm": ctas * warps, "limited_by": limiter}


def demangle(names: List[str]) -> Dict[str, str]:
    cf = shutil.which("c++filt")
    if not cf or not names:
        return {n: n for n in names}
    out = subprocess.run([cf], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


# ---- launch geometry (threads, dynamic shared memory) ----------------------------------------------
# The kernels' tile configs are compile-time structs; a host-only probe compiled by nvcc prints
# the values the launchers use, keyed by the kernel template's signature as c++filt spells it.
PROBE = r"""
#include <cstdio>
#include <typeinfo>
#include "attention/flash_decode_launch.cuh"
#include "attention/flash_prefill_launch.cuh"
#include "attention/flash_prefill_sm90.cuh"
using namespace llmk::gpu::attn;
template <typename T> const char* tn();
template <> const char* tn<__half>() { return "__half"; }
template <> const char* tn<__nv_bfloat16>() { return "__nv_bfloat16"; }
template <> const char* tn<float>() { return "float"; }
template <typename T, int kD> void prefill() {
  using C = typename PrefillTuning<kD>::Cfg;
  std::printf("prefill %s %d %d %d\n", tn<T>(), kD, C::kThreads, C::kSmem);
}
template <typename T, int kD> void sm90() {
  using C = Sm90Cfg<kD>;
  std::printf("sm90 %s %d %d %d\n", tn<T>(), kD, C::kThreads, C::kSmem);
}
template <typename T, int kD> void decode() {
  using Tn = DecodeTuning<T, kD>;
  using C = DecodeCfg<typename Tn::Tile, Tn::kStages>;
  std::printf("decode %s %d %d %d\n", tn<T>(), kD, C::kThreads, C::kSmem);
}
int main() {
  prefill<__half, 64>(); prefill<__half, 128>(); prefill<__half, 256>();
  prefill<__nv_bfloat16, 64>(); prefill<__nv_bfloat16, 128>(); prefill<__nv_bfloat16, 256>();
  decode<__half, 64>(); decode<__half, 128>(); decode<__half, 256>();
  decode<__nv_bfloat16, 64>(); decode<__nv_bfloat16, 128>(); decode<__nv_bfloat16, 256>();
  decode<float, 64>(); decode<float, 128>(); decode<float, 256>();
  sm90<__half, 64>(); sm90<__half, 128>(); sm90<__nv_bfloat16, 64>(); sm90<__nv_bfloat16, 128>();
  sm90<__half, 256>(); sm90<__nv_bfloat16, 256>();
  return 0;
}
"""


def launch_geometry(nvcc: str, tmp: str) -> Dict[tuple, tuple]:
    """{(kind, dtype, padded head dim): (threads, dynamic smem bytes)}."""
    src, exe = os.path.join(tmp, "probe.cu"), os.path.join(tmp, "probe")
    with open(src, "w") as f:
        f.write(PROBE)
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-I", CSRC, "-o", exe, src], check=True,
                   capture_output=True, text=True)
    geo = {}
    for line in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.splitlines():
        kind, dt, d, thr, smem = line.split()
        geo[(kind, dt, int(d))] = (int(thr), int(smem))
    return geo


def geometry_of(name: str, geo: Dict[tuple, tuple]) -> tuple:
    """(threads, dynamic smem) of a demangled kernel name; (None, 0) when unknown."""
    m = re.search(r"flash_prefill_kernel<([\w:]+), [\w:]*PrefillCfg<(\d+),", name)
    if m:
        return geo.get(("prefill", m.group(1).split("::")[-1], int(m.group(2))), (None, 0))
    m = re.search(r"flash_prefill_sm90_kernel<([\w:]+), [\w:]*Sm90Cfg<(\d+)>", name)
    if m:
        return geo.get(("sm90", m.group(1).split("::")[-1], int(m.group(2))), (None, 0))
    m = re.search(r"flash_decode_kernel<([\w:]+), [\w:]*(?:MmaTile<[\w:]+, |FmaTile<)(\d+)>", name)
    if m:
        return geo.get(("decode", m.group(1).split("::")[-1], int(m.group(2))), (None, 0))
    if "flash_combine_kernel" in name:
        return (128, 0)
    return (None, 0)


# ---- driver --------------------------------------------------------------------------------------
@dataclass
class KernelStats:
    unit: str
    kernel: str  # demangled, arguments dropped
    hmma_main_loop: int = 0
    other_main_loop: int = 0
    per_hmma: Optional[float] = None
    instructions: int = 0
    regs: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem_static: int = 0
    smem_dynamic: int = 0
    threads: Optional[int] = None
    occupancy: dict = field(default_factory=dict)
    main_loop_ops: dict = field(default_factory=dict)  # mnemonic -> count (the JSON's breakdown)


def _short(demangled: str) -> str:
    s = re.sub(r"\(.*\)$", "", demangled)  # parameter list
    return s.replace("llmk::gpu::attn::", "")


def analyse(unit: str, cubin: str, ptxas_log: str, arch: str, cuobjdump: str, geo: Dict[tuple, tuple],
            env: dict) -> List[KernelStats]:
    sass = subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True, env=env).stdout
    funcs = parse_sass(sass)
    res = parse_ptxas(ptxas_log)
    if not res:  # a cubin compiled elsewhere: registers and shared memory from its ELF
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], check=True, capture_output=True, text=True,
                               env=env).stdout
        res = parse_res_usage(usage)
    names = demangle(list(funcs))
    out = []
    for mangled, insns in funcs.items():
        dm = names[mangled]
        ks = KernelStats(unit, _short(dm))
        ks.instructions = sum(i.base != "NOP" for i in insns)
        lp = main_loop(insns)
        if lp:
            ks.hmma_main_loop, ks.other_main_loop, ks.per_hmma = lp.hmma, lp.other, lp.per_hmma
            ops: Dict[str, int] = {}
            for ins in insns[lp.start:lp.end + 1]:
                if ins.base != "NOP":
                    ops[ins.base] = ops.get(ins.base, 0) + 1
            ks.main_loop_ops = dict(sorted(ops.items(), key=lambda kv: -kv[1]))
        r = res.get(mangled, {})
        ks.regs, ks.spill_stores, ks.spill_loads = r.get("regs", 0), r.get("spill_stores", 0), r.get("spill_loads", 0)
        ks.smem_static = r.get("smem_static", 0)
        ks.threads, ks.smem_dynamic = geometry_of(dm, geo)
        if ks.threads:
            ks.occupancy = occupancy(arch, ks.regs, ks.threads, ks.smem_static + ks.smem_dynamic)
        out.append(ks)
    return out


def _env(t: Dict[str, Optional[str]]) -> dict:
    env = dict(os.environ)
    if t.get("nvdisasm"):  # cuobjdump -sass calls nvdisasm
        env["PATH"] = os.path.dirname(t["nvdisasm"]) + os.pathsep + env.get("PATH", "")
        env["NVDISASM_PATH"] = os.path.dirname(t["nvdisasm"])
    return env


def collect(arch: str = "sm_90a", only: Optional[List[str]] = None, cubins: Optional[List[str]] = None,
            jobs: int = 2) -> List[KernelStats]:
    t = tools()
    need = missing_tools(need_nvcc=not cubins)
    if need:
        raise RuntimeError(f"sass_stats needs {', '.join(need)} (CUDA toolkit, or the nvidia-cuda-cuobjdump / "
                           "nvidia-cuda-nvdisasm wheels)")
    env = _env(t)
    stats: List[KernelStats] = []
    with tempfile.TemporaryDirectory() as tmp:
        if cubins:
            for c in cubins:
                stats += analyse(os.path.basename(c), c, "", arch, t["cuobjdump"], {}, env)
            return stats
        geo = launch_geometry(t["nvcc"], tmp)
        units = [u for u in UNITS if not only or any(o in u for o in only)]
        procs = []
        for u in units:  # a few nvcc processes at a time
            cubin = os.path.join(tmp, u + ".cubin")
            cmd = [t["nvcc"], "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-I", CSRC, "-o", cubin,
                   os.path.join(CSRC, UNITS[u])]
            procs.append((u, cubin, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
            if len([p for p in procs if p[2].poll() is None]) >= jobs:
                procs[-jobs][2].wait()
        for u, cubin, p in procs:
            log, _ = p.communicate()
            if p.returncode:
                raise RuntimeError(f"nvcc failed on {UNITS[u]}:\n{log[-3000:]}")
            stats += analyse(u, cubin, log, arch, t["cuobjdump"], geo, env)
    return stats


def as_dict(stats: List[KernelStats], arch: str) -> dict:
    return {"arch": arch, "kernels": [asdict(s) for s in stats]}


def _report_module():
    from llmkern.bench import report

    return report


def add_to_report(report_dir: str, stats: List[KernelStats], arch: str) -> None:
    report = _report_module()
    path = os.path.join(report_dir, "results.json")
    res = report.load(path) if os.path.exists(path) else {"suite": "sass", "command": "python bench/sass_stats.py",
                                                          "records": [], "modules": [], "limits": {}, "machine": {}}
    res["sass"] = as_dict(stats, arch)
    report.write_report(res, report_dir, plots=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--only", default="", help="comma-separated unit filters: " + ", ".join(UNITS))
    ap.add_argument("--cubin", nargs="*", default=None, help="analyse these cubins instead of compiling")
    ap.add_argument("--json", default=None, help="write the figures as JSON here")
    ap.add_argument("--report", default=None, help="add the table to the benchmark report in this folder")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    miss = missing_tools(need_nvcc=not a.cubin)
    if miss:
        print(f"sass_stats: skipped, {', '.join(miss)} not found", file=sys.stderr)
        return 2
    stats = collect(a.arch, [o for o in a.only.split(",") if o], a.cubin, a.jobs)
    print("\n".join(_report_module().sass_lines(as_dict(stats, a.arch))).strip())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(as_dict(stats, a.arch), f, indent=1)
    if a.report:
        add_to_report(a.report, stats, a.arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
