"""schemathesis against `llmkern serve` on the embedded default model: bodies generated from the
server's own /openapi.json, valid ones (positive) and invalid ones (negative), POSTed to every
generation route. No response may be a server error (5xx), every status, content type and JSON
body must be one the schema declares, and every invalid body must be refused with a 4xx.
Bounded: a few dozen examples per route and mode, max_tokens <= 4."""
from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers")
import httpx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import checks  # noqa: E402

from serve_helpers import ServerProcess, require_default_model  # noqa: E402

EXAMPLES = 30
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.negative_data_rejection]


@pytest.fixture(scope="module")
def server():
    require_default_model()
    with ServerProcess(["--max-tokens-limit", "4", "--max-n", "2", "--max-model-len", "512",
                        "--kv-cache-memory-gb", "0.25", "--max-num-seqs", "8"], startup_timeout=300) as s:
        yield s


def _operations(server):
    spec = httpx.get(server.base + "/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(spec).include(method="POST")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert sorted(op.path for op in ops) == ["/detokenize", "/tokenize", "/v1/chat/completions", "/v1/completions"]
    return ops


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schema_fuzz_no_server_errors(server, mode):
    seen = {}

    for op in _operations(server):
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=schemathesis.GenerationMode(mode)))
        def fuzz(case):
            r = case.call_and_validate(base_url=server.base, checks=CHECKS, timeout=120)
            seen.setdefault(op.path, []).append(r.status_code)

        fuzz()
    assert set(seen) == {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}
    codes = [c for cs in seen.values() for c in cs]
    assert all(c < 500 for c in codes)
    if mode == "positive":     # valid bodies mostly run (some are refused on cross-field rules)
        assert sum(c == 200 for c in codes) >= len(codes) // 4, codes
    else:
        assert all(400 <= c < 500 for c in codes), codes
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
