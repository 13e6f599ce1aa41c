"""Structured outputs, tools and the rest of the API real clients use, against `llmkern serve` on
the embedded default model, through the `openai` SDK unmodified: outputs constrained by a JSON
schema (validated with `jsonschema` over many samples at temperature 1), the SDK's
`chat.completions.parse` with a pydantic model, a tool-call round trip, logit_bias, echo with
prompt logprobs, best_of, suffix, and the tokenizer endpoints."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

import openai  # noqa: E402
import pydantic  # noqa: E402

from llmkern.models.loader import DEFAULT_MODEL_NAME  # noqa: E402
from serve_helpers import ServerProcess, require_default_model  # noqa: E402

M = DEFAULT_MODEL_NAME
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pets"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
                         "pets": {"type": "array", "maxItems": 3, "items": {"enum": ["cat", "dog", "fish"]}}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server():
    require_default_model()
    with ServerProcess(["--quantization", "none"], startup_timeout=300) as s:  # the seeds below chosen on these weights
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=300)


@pytest.fixture(scope="module")
def http(server):
    import httpx

    with httpx.Client(base_url=server.base, timeout=60) as h:
        yield h


def _chat(content):
    return [{"role": "user", "content": content}]


def test_json_schema_holds_over_many_samples(client):
    r = client.chat.completions.create(
        model=M, messages=_chat("Describe a person."), temperature=1.0, seed=7, n=12, max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1   # really sampled
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_sdk_parse_with_a_pydantic_model(client):
    class Step(pydantic.BaseModel):
        explanation: str = pydantic.Field(max_length=40)
        output: int

    class Answer(pydantic.BaseModel):
        steps: list[Step] = pydantic.Field(max_length=2)
        final: int

    for seed in range(4):
        r = client.chat.completions.parse(model=M, messages=_chat("What is 2 + 3? Explain."), response_format=Answer,
                                          temperature=1.0, seed=seed, max_tokens=200)
        assert isinstance(r.choices[0].message.parsed, Answer), r.choices[0].message.content


def test_json_object_regex_choice_and_grammar(client):
    r = client.chat.completions.create(model=M, messages=_chat("Give me JSON."), temperature=1.0, seed=1,
                                       max_tokens=80, response_format={"type": "json_object"}, n=4)
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
    r = client.completions.create(model=M, prompt="Call me at", temperature=1.0, seed=3, max_tokens=20, n=6,
                                  extra_body={"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}})
    assert all(re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", c.text) for c in r.choices)
    r = client.completions.create(model=M, prompt="Is water wet?", temperature=1.0, seed=5, max_tokens=5, n=6,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert {c.text for c in r.choices} <= {"yes", "no"}
    r = client.completions.create(model=M, prompt="Count:", temperature=1.0, seed=5, max_tokens=12,
                                  extra_body={"guided_grammar": 'root ::= "1" ("," [0-9])*'})
    c = r.choices[0]   # cut by max_tokens, it is a prefix of the language
    assert re.fullmatch(r"1(,[0-9])*" + (",?" if c.finish_reason == "length" else ""), c.text), c


def test_bad_constraints_are_400_naming_the_field(client):
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
              "response_format.json"),
             ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
             ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
             ({"guided_json": PERSON, "guided_regex": "a"}, "guided_regex"),
             ({"response_format": {"type": "xml"}}, "response_format"),
             ({"logit_bias": {"7": 200}}, "logit_bias"),
             ({"logit_bias": {"99999999": 1}}, "logit_bias"),
             ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
             ({"tools": [{"type": "function"}]}, "tools")]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=M, messages=_chat("hi"), max_tokens=4, extra_body=extra)
        assert e.value.body["param"] == param, (extra, e.value.body)


def test_tool_call_round_trip(client):
    msgs = _chat("What is the weather in Paris?")
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = client.chat.completions.create(model=M, messages=msgs, tools=[WEATHER, TIME], tool_choice=choice,
                                           temperature=1.0, seed=2, max_tokens=100, parallel_tool_calls=False)
        m = r.choices[0].message
        assert m.tool_calls, m
        call = m.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in ("get_weather", "get_time")
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "sky": "clear"})}]
    r = client.chat.completions.create(model=M, messages=follow, tools=[WEATHER], temperature=0, max_tokens=30)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls
    # streamed: the calls arrive as tool_calls deltas the SDK accumulates
    stream = client.chat.completions.create(model=M, messages=msgs, tools=[WEATHER], tool_choice="required",
                                            temperature=1.0, seed=4, max_tokens=100, stream=True)
    deltas = [ch.choices[0] for ch in stream if ch.choices]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER["function"]["parameters"])
    assert deltas[-1].finish_reason == "tool_calls"


def test_logit_bias(client, http):
    base = client.completions.create(model=M, prompt="The cat", max_tokens=4, temperature=0, logprobs=1)
    first = base.choices[0].logprobs.tokens[0]
    tid = http.post("/tokenize", json={"prompt": first, "add_special_tokens": False}).json()["tokens"][0]
    banned = client.completions.create(model=M, prompt="The cat", max_tokens=4, temperature=0,
                                       logit_bias={str(tid): -100})
    assert not banned.choices[0].text.startswith(first)
    forced = client.completions.create(model=M, prompt="The cat", max_tokens=3, temperature=1.0, seed=0,
                                       logit_bias={"42": 100})
    detok = http.post("/detokenize", json={"tokens": [42, 42, 42]}).json()["prompt"]
    assert forced.choices[0].text == detok


def test_echo_with_prompt_logprobs_matches_llm_score(client, http):
    from llmkern import LLM

    ids = http.post("/tokenize", json={"prompt": "The capital of France is Paris"}).json()["tokens"]
    r = client.completions.create(model=M, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert r.choices[0].text == http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    ref = LLM(kv_cache_memory_gb=0.25, quantization=None).score([ids[:3]], [ids[3:]])[0].outputs.token_logprobs
    assert lp.token_logprobs[3:] == pytest.approx(ref, abs=2e-4)
    r1 = client.completions.create(model=M, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert len(r1.choices[0].logprobs.token_logprobs) == len(ids) + 1
    assert r1.choices[0].logprobs.token_logprobs[:-1] == lp.token_logprobs
    stream = client.completions.create(model=M, prompt="Hello there", max_tokens=3, echo=True, temperature=0,
                                       stream=True)
    whole = client.completions.create(model=M, prompt="Hello there", max_tokens=3, echo=True, temperature=0)
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == whole.choices[0].text
    assert whole.choices[0].text.startswith("Hello there")


def test_best_of_returns_the_most_likely(client):
    r = client.completions.create(model=M, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3,
                                  best_of=4, n=1, logprobs=0)
    assert len(r.choices) == 1
    full = client.completions.create(model=M, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3,
                                     n=4, logprobs=0)
    best = max(full.choices, key=lambda c: sum(c.logprobs.token_logprobs))
    assert r.choices[0].text == best.text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=M, prompt="x", max_tokens=2, best_of=2, stream=True)
    assert e.value.body["param"] == "best_of"


def test_suffix_and_tokenizer_endpoints(client, http):
    # SmolLM2's vocabulary has no fill-in-the-middle tokens: suffix is refused, naming the field
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=M, prompt="def add(a, b):\n    return ", suffix="\n", max_tokens=8)
    assert e.value.body["param"] == "suffix"
    from types import SimpleNamespace

    from llmkern.serve.protocol import fill_in_middle

    fim = {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}
    eng = SimpleNamespace(tokenizer=SimpleNamespace(tok=SimpleNamespace(token_to_id=fim.get)))
    assert fill_in_middle(eng, "a", "b") == "<fim_prefix>a<fim_suffix>b<fim_middle>"
    h = http
    if True:
        assert h.get("/version").json()["version"]
        info = h.get("/tokenizer_info").json()
        assert info["eos_token"] and info["chat_template"]
        t = h.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
        assert t["count"] == len(t["tokens"]) and "".join(t["token_strs"]) == "Hello world"
        assert h.post("/detokenize", json={"tokens": t["tokens"]}).json()["prompt"] == "Hello world"
        chat = h.post("/tokenize", json={"messages": _chat("hi")}).json()
        assert chat["count"] > 2
        bad = h.post("/detokenize", json={"tokens": [-1]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
