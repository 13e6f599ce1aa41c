"""`llmkern serve` through the real `openai` client: completions and chat equal LLM.generate,
streaming equals non-streaming, n > 1, stop strings, exact usage, 32 concurrent streams, the
error objects (400/404/413), /v1/models and /metrics. Tiny random model; one server per module."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402
import openai  # noqa: E402

from serve_helpers import ServerProcess, tiny_model_dir  # noqa: E402

ENGINE_ARGS = ["--kv-cache-memory-gb", "0.02", "--max-num-seqs", "64", "--max-num-batched-tokens", "512"]
PROMPTS = ["Hello there", "The quick brown fox", "abc", "Once upon a time, in a land far away"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerProcess(["--model", model_dir, "--served-model-name", "tiny", *ENGINE_ARGS]) as s:
        yield s


@pytest.fixture(scope="module")
def llm(model_dir):
    from llmkern import LLM

    return LLM(model_dir, kv_cache_memory_gb=0.02, max_num_seqs=64, max_num_batched_tokens=512)


def _ref(llm, prompts, **kw):
    from llmkern import SamplingParams

    return llm.generate(prompts, SamplingParams(**kw), use_tqdm=False)


def test_completions_equal_llm_generate_and_usage_exact(server, llm):
    c = server.client()
    for p in PROMPTS:
        r = c.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0)
        ref = _ref(llm, [p], max_tokens=24, temperature=0)[0]
        assert r.object == "text_completion" and r.model == "tiny" and len(r.choices) == 1
        assert r.choices[0].text == ref.text
        assert r.choices[0].finish_reason == ref.finish_reason
        assert r.usage.prompt_tokens == len(ref.prompt_token_ids) == len(llm.tokenizer.encode(p))
        assert r.usage.completion_tokens == len(ref.token_ids)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_prompt_forms_token_ids_and_lists(server, llm):
    c = server.client()
    ids = llm.tokenizer.encode("The quick brown fox")
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=10, temperature=0)
    ref = _ref(llm, [ids], max_tokens=10, temperature=0)[0]
    assert r.choices[0].text == ref.text
    r = c.completions.create(model="tiny", prompt=PROMPTS[:3], max_tokens=8, temperature=0)
    refs = _ref(llm, PROMPTS[:3], max_tokens=8, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [x.text for x in refs]
    assert r.usage.prompt_tokens == sum(len(x.prompt_token_ids) for x in refs)
    r = c.completions.create(model="tiny", prompt=[ids, ids[:3]], max_tokens=5, temperature=0)
    assert len(r.choices) == 2


def test_chat_equals_llm_chat(server, llm):
    from llmkern import SamplingParams

    c = server.client()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a fox?"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=0)
    ref = llm.chat(msgs, SamplingParams(max_tokens=20, temperature=0))[0]
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)


def _collect_stream(stream):
    texts, reasons, usage, chunks = {}, {}, None, []
    for ch in stream:
        chunks.append(ch)
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            if c.finish_reason is not None:
                assert c.index not in reasons, "a choice finished twice"
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage, chunks


@pytest.mark.parametrize("stop", [None, ["fo", "e "]])
def test_streaming_equals_non_streaming(server, stop):
    c = server.client()
    for p in PROMPTS:
        full = c.completions.create(model="tiny", prompt=p, max_tokens=32, temperature=0, stop=stop)
        texts, reasons, usage, chunks = _collect_stream(c.completions.create(
            model="tiny", prompt=p, max_tokens=32, temperature=0, stop=stop, stream=True,
            stream_options={"include_usage": True}))
        assert texts[0] == full.choices[0].text
        assert reasons[0] == full.choices[0].finish_reason
        assert usage.completion_tokens == full.usage.completion_tokens
        assert usage.prompt_tokens == full.usage.prompt_tokens
        assert chunks[-1].choices == [] and all(ch.usage is None for ch in chunks[:-1])
    msgs = [{"role": "user", "content": "Tell me a story"}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=32, temperature=0, stop=stop)
    texts, reasons, usage, chunks = _collect_stream(c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=32, temperature=0, stop=stop, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert texts[0] == full.choices[0].message.content
    assert reasons[0] == full.choices[0].finish_reason
    assert usage is None


def test_stop_strings_match_llm(server, llm):
    c = server.client()
    p = PROMPTS[3]
    plain = _ref(llm, [p], max_tokens=40, temperature=0)[0].text
    assert len(plain) > 6
    stop = plain[3:5]          # a stop string that does occur in the output
    r = c.completions.create(model="tiny", prompt=p, max_tokens=40, temperature=0, stop=[stop])
    ref = _ref(llm, [p], max_tokens=40, temperature=0, stop=[stop])[0]
    assert r.choices[0].text == ref.text == plain[:plain.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_n_greater_than_one(server):
    c = server.client()
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=0, n=3)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    assert len({ch.text for ch in r.choices}) == 1            # greedy: all the same
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=1.0, n=4, seed=7)
    assert len({ch.text for ch in r.choices}) > 1             # sampled: they differ
    # One character per token with this tokenizer; an EOS ("stop") is a token without text.
    assert r.usage.completion_tokens == sum(len(ch.text) + (ch.finish_reason == "stop") for ch in r.choices)
    texts, reasons, _, _ = _collect_stream(c.completions.create(
        model="tiny", prompt=["abc", "xyz"], max_tokens=6, temperature=0, n=2, stream=True))
    assert sorted(texts) == [0, 1, 2, 3] and sorted(reasons) == [0, 1, 2, 3]


def test_32_concurrent_streams_equal_llm_generate(server, llm):
    prompts = [f"request {i}: " + "xyz"[i % 3] * (1 + i % 7) for i in range(32)]
    refs = _ref(llm, prompts, max_tokens=16, temperature=0)

    async def run():
        c = server.async_client()

        async def one(p):
            s = await c.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0, stream=True)
            text, reason = "", None
            async for ch in s:
                for x in ch.choices:
                    text += x.text
                    reason = x.finish_reason or reason
            return text, reason

        try:
            return await asyncio.gather(*[one(p) for p in prompts])
        finally:
            await c.close()

    outs = asyncio.run(run())
    assert [t for t, _ in outs] == [r.text for r in refs]
    assert all(r is not None for _, r in outs)


def _post(server, path, body=None, raw=None, headers=None):
    return httpx.post(server.base + path, json=body if raw is None else None, content=raw,
                      headers=headers or {}, timeout=30)


def _err(resp, status):
    assert resp.status_code == status, resp.text
    e = resp.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    assert "Traceback" not in resp.text
    return e


@pytest.mark.parametrize("body,param", [
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": "a", "top_p": 0}, "top_p"),
    ({"prompt": "a", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "a", "n": 0}, "n"),
    ({"prompt": "a", "n": 1000}, "n"),
    ({"prompt": "a", "max_tokens": 10 ** 6}, "max_tokens"),
    ({"prompt": "a", "stop": [""]}, "stop"),
    ({"prompt": "a", "wat": 1}, "wat"),
    ({"prompt": "a", "logprobs": 30}, "logprobs"),
    ({"prompt": "a", "echo": "yes"}, "echo"),
    ({"prompt": "a", "best_of": 1000}, "best_of"),
    ({"prompt": "a", "n": 2, "best_of": 1}, "best_of"),
    ({"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}}, "response_format"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt_token_ids"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": "a", "priority": "high"}, "priority"),
])
def test_400_names_the_parameter(server, body, param):
    e = _err(_post(server, "/v1/completions", {"model": "tiny", **body}), 400)
    assert e["param"] == param and e["type"] == "invalid_request_error"


def test_logprobs_match_hf_transformers(server, model_dir):
    import torch
    import transformers

    c = server.client()
    prompt = [5, 17, 42, 99, 3]
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                             extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    ids = []   # the reference's greedy path
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = list(prompt)
    with torch.inference_mode():
        for i in range(6):
            ref = torch.log_softmax(hf(torch.tensor([seq])).logits[0, -1].double(), -1)
            tok = int(ref.argmax())
            assert abs(lp.token_logprobs[i] - float(ref[tok])) < 1e-3
            top_v, top_i = ref.topk(3)
            got = lp.top_logprobs[i]
            assert len(got) == 3
            for v, t in zip(top_v.tolist(), top_i.tolist()):
                s_ = server_token(t)
                assert abs(got[s_] - v) < 1e-3
            ids.append(tok)
            seq.append(tok)
    assert r.choices[0].text == "".join(server_token(t) for t in ids)
    assert lp.text_offset == [sum(len(server_token(t)) for t in ids[:i]) for i in range(6)]
    # Chat: logprobs + top_logprobs, streamed the same as not.
    msgs = [{"role": "user", "content": "hi"}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                     top_logprobs=2)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)
    assert all(e.logprob == e.top_logprobs[0].logprob for e in content)   # greedy: the top token
    streamed = []
    for ch in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                        top_logprobs=2, stream=True):
        for x in ch.choices:
            if x.logprobs is not None:
                streamed += x.logprobs.content
    # (the second request reuses the first's prompt blocks: same values up to rounding)
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content))
    e = _err(_post(server, "/v1/chat/completions", {"messages": msgs, "top_logprobs": 2}), 400)
    assert e["param"] == "top_logprobs"


def server_token(t: int) -> str:
    from serve_helpers import BOS, CHARS, EOS

    return CHARS[t] if t < len(CHARS) else {BOS: "<s>", EOS: "</s>"}[t]


def test_400_bad_chat_and_json(server):
    e = _err(_post(server, "/v1/chat/completions", {"model": "tiny", "messages": []}), 400)
    assert e["param"] == "messages"
    e = _err(_post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}), 400)
    assert e["param"] == "messages"
    _err(_post(server, "/v1/completions", raw=b"{not json", headers={"content-type": "application/json"}), 400)
    _err(_post(server, "/v1/completions", raw=b"[1, 2]", headers={"content-type": "application/json"}), 400)
    with pytest.raises(openai.BadRequestError) as ei:
        server.client().completions.create(model="tiny", prompt="a", temperature=-2)
    assert ei.value.body["param"] == "temperature"


def test_404_unknown_model_and_route(server):
    e = _err(_post(server, "/v1/completions", {"model": "gpt-9", "prompt": "a"}), 404)
    assert e["param"] == "model" and e["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "a"}])
    _err(httpx.get(server.base + "/v1/nothing", timeout=10), 404)


def test_413_body_and_prompt_too_long(server):
    e = _err(_post(server, "/v1/completions", {"model": "tiny", "prompt": "x" * (3 << 20)}), 413)
    assert e["param"] == "body"
    e = _err(_post(server, "/v1/completions", {"model": "tiny", "prompt": "x" * 600}), 413)
    assert e["param"] == "prompt" and e["code"] == "context_length_exceeded"
    with pytest.raises(openai.APIStatusError) as ei:
        server.client().completions.create(model="tiny", prompt="y" * 700)
    assert ei.value.status_code == 413


def test_models_and_health(server):
    m = server.client().models.list()
    assert [x.id for x in m.data] == ["tiny"]
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200


def test_metrics_parse_and_move(server):
    before = server.metrics()
    r = server.client().completions.create(model="tiny", prompt="metrics", max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    after = server.metrics()
    k = lambda n, **lab: (n, tuple(sorted(lab.items())))  # noqa: E731
    assert after[k("llmkern:prompt_tokens_total")] - before.get(k("llmkern:prompt_tokens_total"), 0) \
        == r.usage.prompt_tokens
    assert after[k("llmkern:generation_tokens_total")] - before.get(k("llmkern:generation_tokens_total"), 0) \
        == r.usage.completion_tokens == 5
    ok = k("llmkern:request_success_total", finished_reason="length")
    assert after[ok] - before.get(ok, 0) == 1
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        key = k(f"llmkern:{h}_count")
        assert after[key] - before.get(key, 0) == 1
    key = k("llmkern:inter_token_latency_seconds_count")
    assert after[key] - before.get(key, 0) == 4
    for g in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "num_preemptions_total"):
        assert k(f"llmkern:{g}") in after
    assert after[k("llmkern:prefix_cache_queries_total")] > before.get(k("llmkern:prefix_cache_queries_total"), 0)
