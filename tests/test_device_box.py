"""The GPU check machine (bench/device_check.sh) has torch, pybind11, cmake and ninja but none of the
runtime's extras (tokenizers, transformers, safetensors, gguf, tqdm, matplotlib; numpy is not
guaranteed). Simulated here by hiding those packages from a fresh interpreter: `pytest -m cuda`
must still collect the kernel tests' cuda cases without a single collection error, or the device
check would run no CUDA test at all."""
from __future__ import annotations

import os
import re
import subprocess
import sys

HIDDEN = ("tokenizers", "numpy", "transformers", "safetensors", "gguf", "tqdm", "matplotlib")

# sitecustomize runs at interpreter start-up, before pytest imports anything.
BLOCKER = f"""
import sys

class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {HIDDEN!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden: simulated device box)", name=name)

sys.meta_path.insert(0, _Hidden())
"""

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Kernel test modules whose cuda cases the device check exists to run.
KERNEL_MODULES = ("test_attention.py", "test_attention_cuda.py", "test_kvcache.py", "test_layernorm.py",
                  "test_rotary.py", "test_sampling.py", "test_spec_sampling.py", "test_grid_limits.py")


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    import llmkern  # the package these tests run against (source tree or installed wheel)

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(llmkern.__file__)))
    path = os.pathsep.join([str(tmp_path), pkg_root, os.path.join(ROOT, "tests")])
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_blocker_hides_the_extras(tmp_path):
    r = _run(tmp_path, "-c", "import tokenizers")
    assert r.returncode != 0 and "simulated device box" in r.stderr
    r = _run(tmp_path, "-c", "import numpy")
    assert r.returncode != 0 and "simulated device box" in r.stderr


def test_cuda_tests_collect_without_the_extras(tmp_path):
    r = _run(tmp_path, "-m", "pytest", "tests", "-m", "cuda", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-W", "ignore::UserWarning")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "error" not in out.lower().split("collected")[-1], out[-4000:]
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    for mod in KERNEL_MODULES:
        assert any(i.startswith(f"tests/{mod}::") for i in ids), f"no cuda test collected from {mod}"
    # What the device check selects is the cuda cases: every id is a cuda parameter or a cuda-only test.
    assert all(re.search(r"cuda", i) for i in ids), [i for i in ids if "cuda" not in i][:5]
