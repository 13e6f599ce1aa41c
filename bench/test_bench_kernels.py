"""Kernel benchmarks (attention, KV-cache ops, sampling) under pytest-benchmark; see conftest.py."""
import pytest

from llmkern.bench import suite


@pytest.mark.parametrize("name", suite.discover()["kernels"])
def test_kernels(bench_module, name):
    bench_module(name, "kernels")
