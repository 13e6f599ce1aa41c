"""The wheel checker of .ci/check_wheel.py fails on a symbol or a library over the manylinux_2_28
budget: on made-up readelf output, and on a small library compiled here that calls a function
only a newer glibc exports and needs the OpenMP runtime."""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("check_wheel", os.path.join(REPO, ".ci", "check_wheel.py"))
check_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_wheel)

DYN_SYMS = """
Symbol table '.dynsym' contains 5 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     1: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND memcpy@GLIBC_2.14 (2)
     2: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND pthread_create@GLIBC_2.34 (3)
     3: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND _ZNSt6thread6_StateD2Ev@GLIBCXX_3.4.22 (4)
     4: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND _ZSt21__glibcxx_assert_failPKciS0_S0_@GLIBCXX_3.4.30 (5)
     5: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND __truncsfhf2@GCC_12.0.0 (6)
     6: 00000000000011f0    42 FUNC    GLOBAL DEFAULT   12 PyInit__C
"""


def test_symbols_over_the_budget_are_named():
    bad = check_wheel.over_budget(DYN_SYMS)
    assert bad == ["_ZSt21__glibcxx_assert_failPKciS0_S0_@GLIBCXX_3.4.30", "__truncsfhf2@GCC_12.0.0",
                   "pthread_create@GLIBC_2.34"]
    assert check_wheel.max_versions(DYN_SYMS) == {"GCC": "12.0.0", "GLIBC": "2.34", "GLIBCXX": "3.4.30"}


def test_versions_compare_as_numbers():
    assert not check_wheel.over_budget("  1: 0 0 FUNC GLOBAL DEFAULT UND f@GLIBC_2.3.4 (2)\n")
    assert check_wheel.over_budget("  1: 0 0 FUNC GLOBAL DEFAULT UND f@GLIBC_2.100 (2)\n") == ["f@GLIBC_2.100"]


def test_needed_libraries_are_read():
    dynamic = (" 0x0000000000000001 (NEEDED)             Shared library: [libgomp.so.1]\n"
               " 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n")
    assert check_wheel.needed(dynamic) == ["libgomp.so.1", "libc.so.6"]


def _cc_glibc_234():
    if platform.system() != "Linux" or not shutil.which("cc") or not shutil.which("readelf"):
        return False
    libc = platform.libc_ver()
    return libc[0] == "glibc" and tuple(int(x) for x in libc[1].split(".")) >= (2, 34)


@pytest.mark.skipif(not _cc_glibc_234(), reason="needs cc, readelf and glibc >= 2.34 (pthread_create@GLIBC_2.34)")
def test_a_real_library_over_the_budget_fails(tmp_path, capsys):
    src = tmp_path / "t.c"
    src.write_text("#include <pthread.h>\nstatic void* f(void* a) { return a; }\n"
                   "int start(void) { pthread_t t; return pthread_create(&t, 0, f, 0); }\n"
                   "int team(void) { int n = 0;\n#pragma omp parallel reduction(+:n)\n n += 1;\n return n; }\n")
    lib = tmp_path / "libt.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-fopenmp", "-o", str(lib), str(src), "-lpthread"], check=True)
    problems = check_wheel.check(str(lib))
    assert any("pthread_create@GLIBC_2.34" in p for p in problems), problems
    assert any("needs libgomp.so.1" in p for p in problems), problems
    # The same file inside a wheel, next to a library needing something a system need not have.
    whl = tmp_path / "x-0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(lib, "x/libt.so")
    assert check_wheel.main([str(whl)]) == 1
    assert "pthread_create@GLIBC_2.34" in capsys.readouterr().err
