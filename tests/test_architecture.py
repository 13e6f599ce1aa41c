"""The package's shape, read from its source with `ast` (lazy imports inside functions count too):
every import between packages points down the layer list below, no two files import each other
through any chain, and no product file (Python module, C/C++/CUDA source under csrc/, the Explorer's
static .js / .css) grows past MAX_LINES. Fails naming the offending import or file."""
from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
REPO = os.path.dirname(ROOT)
PKG = "llmkern"
MAX_LINES = 500
NATIVE_EXTS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh")  # under csrc/
STATIC_EXTS = (".js", ".css")  # under python/llmkern/ (the Explorer's page)

# Top to bottom. A file may import a package on its own row or any row below; "llmkern" is the
# package facade (llmkern/__init__.py); the last row is the base: single modules that import
# nothing above them (they may import each other, as long as there is no loop).
LAYERS: List[Set[str]] = [
    {"cli"},                       # one module per command
    {"explore"},                   # tools: the explorer reads the optimiser's database,
    {"optimize"},                  #   the optimiser calibrates with the benchmarks' timers,
    {"bench"},                     #   and both drive servers with the load generator
    {"loadgen"},
    {"integrations"},              # Ray: Data over offline jobs, Serve over the router's policy and serve's app
    {"router"},                    # HTTP fronts: the router (and the launchers) over serve
    {"serve"},
    {"offline"},
    {"llmkern"},                   # the public facade (llmkern.LLM, llmkern.<op>)
    {"engine"},
    {"pd"},                        # prefill-decode KV hand-over: interface, connectors, factory
    {"distributed"},               # TP/PP/EP on torch.distributed
    {"kvcache"},                   # KV sizing, tiers' tensors, block gathers
    {"models"},
    {"layers"},
    {"compat"},
    {"ops"},
    {"procs", "machine_load", "cpu_affinity", "_build", "_backend", "_args", "_errors", "_version_info", "_C", "_simt"},
]
BASE = LAYERS[-1]


def modules() -> Dict[str, str]:
    """module name -> file (packages by their __init__.py), plus the compiled extensions."""
    mods = {}
    for d, _, files in os.walk(os.path.join(ROOT, PKG)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    mods[f"{PKG}._C"] = mods[f"{PKG}._simt"] = ""  # extensions: they import nothing of ours
    return mods


def imports(mods: Dict[str, str]) -> Dict[str, Set[str]]:
    """module -> the package modules it imports (at any depth of its code)."""
    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        if not path:
            continue
        pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{node.module}" if node.module else up
                for a in node.names:  # a submodule, else a name defined in (or re-exported by) base
                    targets.append(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    name = a.name
                    while name and name not in mods:
                        name = name.rpartition(".")[0]
                    targets.append(name)
            graph[mod].update(t for t in targets if t in mods and t != mod)
    return graph


def unit(mod: str) -> str:
    """The package (or base module) a module belongs to: llmkern.engine.scheduler -> engine."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else PKG


def rank(u: str) -> int:
    for i, row in enumerate(LAYERS):
        if u in row:
            return i
    raise AssertionError(f"llmkern.{u}: a package missing from LAYERS in {__file__}: place it in the layer list")


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_every_package_is_placed():
    for mod in modules():
        rank(unit(mod))


def test_imports_between_packages_point_down():
    graph = imports(modules())
    up = []
    for src, dsts in graph.items():
        for dst in dsts:
            a, b = unit(src), unit(dst)
            if a == b or (a in BASE and b in BASE):
                continue
            if rank(a) > rank(b):
                up.append(f"{src} imports {dst} ({a} is below {b})")
    assert not up, "imports pointing up the layers:\n  " + "\n  ".join(sorted(up))


def test_no_import_loops_between_files():
    loops = cycles(imports(modules()))
    assert not loops, "import loops:\n  " + "\n  ".join(" <-> ".join(c) for c in loops)


def product_files() -> List[str]:
    """The package's Python modules, the C/C++/CUDA sources under csrc/ and the package's static
    .js / .css (the Explorer's page)."""
    paths = [path for path in modules().values() if path]
    for top, exts in ((os.path.join(REPO, "csrc"), NATIVE_EXTS), (os.path.join(ROOT, PKG), STATIC_EXTS)):
        for d, _, files in os.walk(top):
            paths += [os.path.join(d, f) for f in files if f.endswith(exts)]
    return sorted(paths)


def test_no_product_file_over_the_limit():
    big = []
    paths = product_files()
    assert any(p.endswith(".cu") for p in paths) and any(p.endswith(".js") for p in paths)
    for path in paths:
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            big.append(f"{os.path.relpath(path, REPO)}: {n} lines")
    assert not big, f"files over {MAX_LINES} lines:\n  " + "\n  ".join(big)


def test_the_checker_sees_a_loop_and_an_upward_import():
    """The analysis itself: a made-up graph with a loop and an engine -> serve edge."""
    g = {"llmkern.engine.a": {"llmkern.serve.b"}, "llmkern.serve.b": {"llmkern.engine.a"}}
    assert cycles(g) == [["llmkern.engine.a", "llmkern.serve.b"]]
    assert rank(unit("llmkern.engine.a")) > rank(unit("llmkern.serve.b"))


def test_the_serve_command_offers_only_router_policies():
    from llmkern.router.policies import POLICIES
    from llmkern.serve.command_args import ROUTER_POLICIES

    assert set(ROUTER_POLICIES) <= set(POLICIES)
