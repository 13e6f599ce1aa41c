"""The build: module contents, build_info, SIMD dispatch."""
import os
import subprocess
import sys

import pytest
import torch

import llmkern
from llmkern import _C
from runtime_helpers import cpu_flags as _cpu_flags


def test_build_info_keys():
    info = llmkern.build_info()
    for key in ("version", "backends", "cuda_compiled", "cuda_archs", "cpu_simd", "num_threads", "threads", "simt"):
        assert key in info
    assert "cpu" in info["backends"]
    assert info["cpu_simd"] in info["cpu_simd_compiled"]
    assert info["version"] == llmkern.__version__
    # every CPU kernel family names the instructions it runs on
    paths = info["cpu_kernels"]
    assert {"linear fp32", "linear bf16", "linear quantised", "attention bf16", "moe bf16", "sampling"} <= set(paths)
    assert info["cpu_amx"] in ("off", "hardware", "emulated")
    assert (info["cpu_simd"] == "amx") == (info["cpu_amx"] != "off")
    for family in ("linear bf16", "moe bf16", "attention bf16"):
        assert paths[family].startswith("amx-bf16") == (info["cpu_amx"] != "off"), paths
    # the int8 tiles need AMX-INT8 besides the AMX level (the model of them needs neither)
    quant = paths["linear quantised"]
    if info["cpu_amx"] == "emulated":
        assert quant.startswith("amx-int8 emulated from "), paths
    else:
        int8 = info["cpu_amx"] == "hardware" and "amx_int8" in _cpu_flags()
        assert quant.startswith("amx-int8 from ") == int8, paths


@pytest.mark.skipif(not {"amx_tile", "amx_bf16"} <= set(_cpu_flags()), reason="this CPU has no AMX")
def test_amx_taken_where_the_cpu_has_it():
    # A CPU with AMX runs the tile kernels unless Linux refuses the process the tile state, which it
    # does when a thread's alternate signal stack is too small for it (one a fault handler may have
    # installed before llmkern asks: hence a plain interpreter here, as a user's process is).
    # The GEMM then runs on the hardware tiles: checked against fp64.
    if "amx" not in llmkern.build_info()["cpu_simd_compiled"]:
        pytest.skip("this build has no AMX tile kernels")
    code = (
        "import torch, llmkern, torch.nn.functional as F\n"
        "info = llmkern.build_info()\n"
        "assert info['cpu_amx'] == 'hardware' and info['cpu_simd'] == 'amx', info\n"
        "torch.manual_seed(0)\n"
        "for rows, k, n in [(16, 64, 32), (40, 577, 192), (300, 576, 80)]:\n"
        "    x = torch.randn(rows, k).bfloat16(); w = (torch.randn(n, k) / k ** 0.5).bfloat16()\n"
        "    ref = F.linear(x.double(), w.double())\n"
        "    out = llmkern.linear_packed(x, llmkern.pack_linear_weight_bf16(w), n).double()\n"
        "    assert ((out - ref).abs() <= ref.abs() * 2 ** -8 + 1e-5 * ref.abs().max()).all(), (rows, k, n)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONFAULTHANDLER", "LLMKERN_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_build_info_says_what_the_build_carries():
    """The CUDA toolkit and the architectures with machine code / PTX (cmake/cuda_info.cmake), the
    thread modes; `llmkern --version` prints them."""
    info = llmkern.build_info()
    assert "pool" in info["threads_compiled"] and info["threads"] in info["threads_compiled"]
    if info["cuda_compiled"] and "simt" not in info["backends"]:
        assert info["cuda_toolkit"].split(".")[0].isdigit()
        sass, ptx = info["cuda_sass"].split(","), info["cuda_ptx"].split(",")
        assert set(info["cuda_archs"].split(",")) <= set(sass) and ptx[0] == min(sass, key=lambda a: int(a[:2]))
    else:
        assert info["cuda_toolkit"] == info["cuda_sass"] == info["cuda_ptx"] == ""
    r = subprocess.run([sys.executable, "-m", "llmkern.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"llmkern {info['version']}\n") and "CPU: scalar" in r.stdout
    assert (f"SASS sm_{{{info['cuda_sass']}}}" in r.stdout) if info["cuda_toolkit"] else ("CUDA: not built" in r.stdout)


def test_both_extensions_import_in_one_process():
    # _C and the SIMT emulator (_simt) bind the same C++ classes; pybind11 types are global to the
    # interpreter, so each class must be module-local or the second import fails. A fresh process:
    # this one may have imported them already.
    code = ("import importlib.util, llmkern, llmkern._C as c\n"
            "if importlib.util.find_spec('llmkern._simt') is None: raise SystemExit(0)\n"
            "import llmkern._simt as s\n"
            "assert c.DecodeStepCpu is not s.DecodeStepCpu\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_cuda_compiled_when_nvcc_present():
    # CI machines have nvcc: the CUDA sources must have been compiled, for the default archs.
    import shutil

    if shutil.which("nvcc") is None or os.environ.get("LLMKERN_CUDA") == "OFF":
        pytest.skip("no nvcc on PATH")
    info = llmkern.build_info()
    assert info["cuda_compiled"] and "cuda" in info["backends"]
    assert info["cuda_archs"]


def test_every_op_is_registered_with_torch_library():
    # flash-attn's dense and packed variants are views of their arguments passed to the registered
    # varlen op, so torch.compile and opcheck meet that op; the MoE names in moe.COMPOSED are plain
    # torch or a choice between registered ops; linear_gguf.PACKERS run at load time on the host;
    # every other op is registered itself.
    from llmkern.ops import flash_attn_variants, linear_gguf, moe

    for name in llmkern.ops.__all__:
        if name in flash_attn_variants.__all__ or name in moe.COMPOSED or name in linear_gguf.PACKERS:
            continue
        assert hasattr(getattr(llmkern.ops, name), "op"), name
        assert hasattr(torch.ops.llmkern, name), name


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "amx", "amx-emulated"])
def test_each_simd_level_runs(isa):
    # Each SIMD build of the CPU kernels gives the same bytes (subprocess: the level is read once).
    code = (
        "import torch, llmkern\n"
        "torch.manual_seed(0)\n"
        "kc = torch.zeros(6, 5, 2, 16, dtype=torch.bfloat16); vc = torch.zeros_like(kc)\n"
        "k = torch.randn(9, 2, 16).bfloat16(); v = torch.randn(9, 2, 16).bfloat16()\n"
        "s = torch.randperm(30)[:9]\n"
        "llmkern.reshape_and_cache_flash(k, v, kc, vc, s)\n"
        "assert torch.equal(kc.view(-1, 2, 16)[s], k)\n"
        "print(llmkern.build_info()['cpu_simd'], llmkern.build_info()['cpu_amx'])\n"
    )
    env = dict(os.environ, LLMKERN_CPU_ISA=isa)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    info = llmkern.build_info()
    supported, compiled = info["cpu_simd_supported"], info["cpu_simd_compiled"]
    order = ["scalar", "avx2", "avx512", "amx"]
    if isa == "amx-emulated":  # the tile kernels' software model: any CPU with the AVX-512 level
        emulated = "amx" in compiled and order.index(supported) >= order.index("avx512")
        expect = "amx emulated" if emulated else f"{supported} off"
    else:
        level = isa if order.index(isa) <= order.index(supported) else supported
        if isa not in compiled:
            level = "scalar"
        expect = f"{level} {'hardware' if level == 'amx' else 'off'}"
    assert out.stdout.strip() == expect


def test_numpy_arrays_cross_via_dlpack():
    import numpy as np

    kc = np.zeros((2, 4, 1, 8), np.float32)
    vc = np.zeros_like(kc)
    k = np.arange(24, dtype=np.float32).reshape(3, 1, 8)
    _C.reshape_and_cache_flash(k, k, kc, vc, np.array([1, -1, 6], np.int64), "auto", None, None, 0)
    assert (kc.reshape(-1, 1, 8)[1] == k[0]).all() and (kc.reshape(-1, 1, 8)[6] == k[2]).all()


# One kernel per op family: nvcc registers each kernel with the CUDA runtime by its mangled name,
# so the names are in the module's binary exactly when the device code was compiled in.
CUDA_KERNELS = [
    b"reshape_and_cache_kernel", b"copy_blocks_kernel", b"append_kv_kernel",
    b"flash_prefill_kernel", b"flash_decode_kernel", b"flash_combine_kernel",
    b"sample_rows_kernel", b"renorm_rows_kernel", b"chain_speculative_kernel",
    b"apply_penalties_kernel",
]


def test_cuda_kernels_are_in_the_extension():
    info = llmkern.build_info()
    if not info["cuda_compiled"]:
        pytest.skip("built without CUDA")
    with open(_C.__file__, "rb") as f:
        blob = f.read()
    assert b".nv_fatbin" in blob, "no device code section in the extension"
    missing = [k.decode() for k in CUDA_KERNELS if k not in blob]
    assert not missing, f"CUDA kernels missing from {_C.__file__}: {missing}"
    assert set(info["cuda_archs"].split(",")) >= {"80", "90"} or os.environ.get("LLMKERN_CUDA_ARCHS")
