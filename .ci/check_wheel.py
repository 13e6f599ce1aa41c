"""Checks that a wheel's (or a shared library's) ELF files stay within a manylinux policy: the
versioned symbols they import (GLIBC_, GLIBCXX_, CXXABI_, GCC_) and the libraries they need.

    python .ci/check_wheel.py dist/llmkern-*.whl            # every .so in the wheel
    python .ci/check_wheel.py build/.../_C.cpython-311-x86_64-linux-gnu.so

Reads the files with `readelf` (binutils). The budget is manylinux_2_28's (PEP 600; the numbers are
those of auditwheel's policy file): what RHEL 8 / Rocky 8, Ubuntu 20.04 and newer all provide.
Exits 1 naming every symbol or library over the budget."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Tuple

# The newest version of each symbol-version family a manylinux_2_28 system provides.
BUDGET: Dict[str, Tuple[int, ...]] = {
    "GLIBC": (2, 28),
    "GLIBCXX": (3, 4, 24),
    "CXXABI": (1, 3, 11),
    "GCC": (7, 0, 0),
}
# Libraries every manylinux_2_28 system has and a wheel may need (the rest would have to be
# carried in the wheel). libstdc++/libgcc_s: the manylinux container's compiler links them so that
# only their 2.28-era symbols are imported (the budget above); a build elsewhere carries its own.
# Not libgomp: the wheels have no OpenMP (docs/wheels.md).
ALLOWED_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libstdc++.so.6",
                "libgcc_s.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}

_VERSION_RE = re.compile(r"^([A-Z]+)_([0-9][0-9.]*)$")
_NEEDED_RE = re.compile(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]")
# readelf --dyn-syms: "  12: 0000000000000000  0 FUNC GLOBAL DEFAULT UND pthread_create@GLIBC_2.34 (5)"
_UND_RE = re.compile(r"\sUND\s+(\S+)@([A-Z]+_[0-9][0-9.]*)")


def parse_version(v: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x)


def readelf(path: str, *flags: str) -> str:
    return subprocess.run(["readelf", "-W", *flags, path], check=True, capture_output=True, text=True).stdout


def over_budget(dyn_syms: str) -> List[str]:
    """'symbol@FAMILY_x.y' for each imported symbol whose version is above the budget."""
    bad = []
    for sym, ver in sorted(set(_UND_RE.findall(dyn_syms))):
        m = _VERSION_RE.match(ver)
        if m and m.group(1) in BUDGET and parse_version(m.group(2)) > BUDGET[m.group(1)]:
            bad.append(f"{sym}@{ver}")
    return bad


def max_versions(dyn_syms: str) -> Dict[str, str]:
    """The newest version imported per family (for the report)."""
    best: Dict[str, Tuple[int, ...]] = {}
    for _, ver in _UND_RE.findall(dyn_syms):
        m = _VERSION_RE.match(ver)
        if m:
            fam, v = m.group(1), parse_version(m.group(2))
            best[fam] = max(best.get(fam, v), v)
    return {fam: ".".join(map(str, v)) for fam, v in sorted(best.items())}


def needed(dynamic: str) -> List[str]:
    return _NEEDED_RE.findall(dynamic)


def check_elf(path: str, name: str) -> List[str]:
    """Problems of one ELF file (empty: within the budget); prints a one-line summary."""
    syms, libs = readelf(path, "--dyn-syms"), needed(readelf(path, "-d"))
    problems = [f"{name}: imports {s} (manylinux_2_28 allows {s.split('@')[1].split('_')[0]} <= "
                f"{'.'.join(map(str, BUDGET[s.split('@')[1].split('_')[0]]))})" for s in over_budget(syms)]
    problems += [f"{name}: needs {lib}, which a manylinux_2_28 system need not have" for lib in libs
                 if lib not in ALLOWED_LIBS]
    newest = ", ".join(f"{k} {v}" for k, v in max_versions(syms).items())
    print(f"{name}: {os.path.getsize(path) / 2**20:.1f} MiB; newest imports: {newest}; needs: {', '.join(libs)}")
    return problems


def is_elf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def check(path: str) -> List[str]:
    if not os.path.isfile(path):
        return [f"{path}: no such file"]
    if not zipfile.is_zipfile(path):
        return check_elf(path, os.path.basename(path))
    problems, found = [], 0
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(path) as whl:
        for member in whl.namelist():
            if member.endswith(".so") or ".so." in member:
                out = whl.extract(member, tmp)
                if is_elf(out):
                    found += 1
                    problems += check_elf(out, member)
    if not found:
        problems.append(f"{os.path.basename(path)}: no shared library in the wheel")
    return problems


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="wheels (.whl) or shared libraries")
    problems = [p for path in ap.parse_args(argv).paths for p in check(path)]
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
