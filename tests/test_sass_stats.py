"""bench/sass_stats.py: the SASS parser and main-loop finder on hand-written listings, then (when
nvcc and cuobjdump are installed) on a kernel compiled here whose loop holds a known number of
mma.sync, and the script itself on the combine kernel."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from llmkern.bench import report  # noqa: E402
import sass_stats  # noqa: E402

LISTING = """
	code for sm_90a
		Function : _Z3fooPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/                   LDSM.16.M88.4 R8, [R2] ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0060*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0070*/                   FMUL R3, R3, R4 ;
        /*0080*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0090*/                   ISETP.GE.AND P0, PT, R3, 0x8, PT ;
        /*00a0*/               @!P0 BRA 0x50 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   BRA 0xc0;
		Function : _Z3barv
        /*0000*/                   EXIT ;
"""

PTXAS = """ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooPf
    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2064 bytes smem, 368 bytes cmem[0]
"""


def test_parse_and_main_loop():
    funcs = sass_stats.parse_sass(LISTING)
    assert set(funcs) == {"_Z3fooPf", "_Z3barv"} and len(funcs["_Z3fooPf"]) == 13
    ls = sass_stats.loops(funcs["_Z3fooPf"])
    # two loops (the trailing self-branch is a loop with nothing but itself)
    assert sorted((lp.hmma, lp.other) for lp in ls) == [(0, 1), (1, 2), (2, 4)]
    lp = sass_stats.main_loop(funcs["_Z3fooPf"])
    assert (lp.hmma, lp.other, lp.per_hmma) == (2, 4, 2.0)
    assert sass_stats.main_loop(funcs["_Z3barv"]) is None


NESTED = """
		Function : _Z3nestv
        /*0000*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0020*/                   FADD R3, R3, R4 ;
        /*0030*/               @P1 BRA 0x10 ;
        /*0040*/                   FMUL R3, R3, R4 ;
        /*0050*/               @P0 BRA 0x0 ;
        /*0060*/                   EXIT ;
"""


def test_main_loop_is_innermost():
    """An outer loop around an HMMA loop (masked and unmasked tile steps) is not the main loop."""
    lp = sass_stats.main_loop(sass_stats.parse_sass(NESTED)["_Z3nestv"])
    assert (lp.hmma, lp.other) == (1, 2)


def test_ptxas_resources_and_occupancy():
    r = sass_stats.parse_ptxas(PTXAS)["_Z3fooPf"]
    assert r == {"regs": 255, "spill_stores": 8, "spill_loads": 4, "stack": 8, "smem_static": 2064}
    # 255 registers x 128 threads: 4 warps x 8192 registers -> 2 CTAs by registers
    assert sass_stats.occupancy("sm_90a", 255, 128, 99328)["ctas_per_sm"] == 2
    # 144 KiB of shared memory: one CTA per SM on sm_90a
    occ = sass_stats.occupancy("sm_90a", 128, 128, 144 * 1024)
    assert occ["ctas_per_sm"] == 1 and occ["limited_by"] == "shared memory"


def test_report_section():
    sass = {"arch": "sm_90a", "kernels": [dict(unit="u", kernel="k<128>", hmma_main_loop=256, per_hmma=3.25,
                                               regs=128, spill_stores=0, spill_loads=0, smem_static=0,
                                               smem_dynamic=1024, occupancy={"ctas_per_sm": 2})]}
    md = "\n".join(report.sass_lines(sass))
    assert "static SASS figures (sm_90a)" in md and "| `k<128>` | 256 | 3.25 | 128 | 0/0 | 1024 | 2 |" in md


def _need_tools():
    miss = sass_stats.missing_tools()
    if miss:
        pytest.skip(f"{', '.join(miss)} not installed (CUDA toolkit / nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")


KERNEL = r"""
#include "common/simt.h"
__global__ void loop4(const uint32_t* a, float* out, int n) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  uint32_t fa[4] = {a[0], a[1], a[2], a[3]}, fb[2] = {a[4], a[5]};
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k) llmk::simt::mma_m16n8k16_bf16(d, fa, fb, d);
    fb[0] += d[0] > 0.f;
  }
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
"""


def test_compiled_kernel(tmp_path):
    _need_tools()
    src, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    src.write_text(KERNEL)
    t = sass_stats.tools()
    subprocess.run([t["nvcc"], "-cubin", "-arch=sm_90a", "-O3", "-I", os.path.join(ROOT, "csrc"), "-o", str(cubin),
                    str(src)], check=True, capture_output=True, text=True)
    (ks,) = sass_stats.collect("sm_90a", cubins=[str(cubin)])
    assert ks.kernel.startswith("loop4") and ks.hmma_main_loop == 4
    assert ks.other_main_loop > 0 and ks.per_hmma == ks.other_main_loop / 4
    assert ks.regs > 0  # from cuobjdump -res-usage (no ptxas log for a given cubin)


def test_script_on_combine_kernel(tmp_path):
    _need_tools()
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sass_stats.py"), "--only", "combine",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    ks = {k["kernel"]: k for k in data["kernels"]}
    assert len(ks) == 3 and all("flash_combine_kernel" in n for n in ks)
    for k in ks.values():  # resources read from ptxas, geometry from the launcher
        assert k["regs"] > 0 and k["threads"] == 128 and k["occupancy"]["ctas_per_sm"] >= 1
        assert k["smem_static"] > 0 and k["hmma_main_loop"] == 0
    assert "flash_combine_kernel" in r.stdout


HGMMA = """
		Function : _Z4wgmmv
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R88, R20, gdesc[UR8], R88, gsb0 ;
        /*0030*/                   WARPSYNC.ALL ;
        /*0040*/                   BRA 0x0 ;
"""


def test_hgmma_counts_as_its_hmma_work():
    """An HGMMA m64nNk16 is N/8 m16n8k16 products per warp: the per-HMMA figure of a wgmma loop
    is comparable with an mma.sync loop's."""
    lp = sass_stats.main_loop(sass_stats.parse_sass(HGMMA)["_Z4wgmmv"])
    assert (lp.hmma, lp.other, lp.hmma_equiv) == (2, 3, 16 + 8)
    assert lp.per_hmma == 3 / 24
