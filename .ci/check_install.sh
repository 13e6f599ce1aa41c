#!/usr/bin/env bash
# The built wheel in a fresh venv beside the oldest torch pyproject.toml allows (and the NumPy 1.x
# of its time), smoke-tested there; then the sdist, built, and a CPU-only wheel built from it. Usage: .ci/check_install.sh dist/llmkern-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
wheel="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
old_torch=2.7.1
grep -q '"torch>=2.7"' pyproject.toml || { echo "pyproject.toml's torch floor moved: update old_torch here" >&2; exit 1; }

start=$SECONDS
python -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "torch==$old_torch" "numpy<2" "$wheel"
(cd "$tmp" && "$tmp/venv/bin/python" "$repo/.ci/smoke_test.py")  # away from the source tree
echo "wheel beside torch $old_torch: $((SECONDS - start)) s"

start=$SECONDS
python -m pip install -q build
python -m build -q --sdist -o "$tmp/sdist" . >/dev/null
sdist=$(ls "$tmp"/sdist/llmkern-*.tar.gz)
LLMKERN_CUDA=OFF python -m pip wheel -q --no-deps -w "$tmp/from-sdist" "$sdist"
python .ci/check_wheel.py "$tmp"/from-sdist/llmkern-*.whl
echo "sdist $(basename "$sdist") built into a CPU wheel: $((SECONDS - start)) s"
