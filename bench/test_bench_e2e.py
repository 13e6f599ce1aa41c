"""End-to-end benchmarks (runtime vs HF transformers) under pytest-benchmark; see conftest.py."""
import pytest

from llmkern.bench import suite


@pytest.mark.parametrize("name", suite.discover()["e2e"])
def test_e2e(bench_module, name):
    bench_module(name, "e2e")
