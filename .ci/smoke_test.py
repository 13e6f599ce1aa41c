"""An installed llmkern imports and runs: build info, `llmkern --version`, one CPU op against its
torch reference, a C++ error reaching Python as an exception (the module's own C++ runtime and
unwinder). Run by .ci/run in a fresh venv beside an older torch, and by cibuildwheel on each wheel."""
import subprocess
import sys

import torch

import llmkern

info = llmkern.build_info()
print("torch", torch.__version__, "| llmkern", info["version"], "| CUDA", info["cuda_toolkit"] or "-",
      "SASS", info["cuda_sass"] or "-", "PTX", info["cuda_ptx"] or "-", "| CPU", info["cpu_simd_compiled"])
print(subprocess.run([sys.executable, "-m", "llmkern.cli", "--version"], check=True, capture_output=True,
                     text=True).stdout.strip())

x, w = torch.randn(4, 64), torch.rand(64) + 0.5
out = torch.empty_like(x)
llmkern.rms_norm(out, x, w, 1e-6)
ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

try:
    llmkern.rms_norm(out, x, torch.ones(32), 1e-6)  # weight of the wrong length
except ValueError as e:
    assert "weight" in str(e) and "32" in str(e), e  # numbers format: the private libstdc++ works
else:
    raise AssertionError("a bad weight shape was accepted")
print("smoke test passed")
