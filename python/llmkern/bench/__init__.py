"""Benchmarks: llmkern against named peers measured in the same run.

suite.py (registry and runner), report.py (JSON, Markdown, plots), common.py (timing helpers and
the Record schema), throughput.py (end-to-end offline throughput vs HF transformers), serving.py and routing.py
(the server and router load generators), cli.py
(`llmkern bench`) and one bench_*.py module per benchmark, each with run(quick, device) -> [Record].
"""
