"""Structured outputs in process (`SamplingParams(structured_outputs=..., logit_bias=...,
prompt_logprobs=...)` through `LLM.generate`), the parameter checks, and the tool-call parsing of
the server, against independent references: `jsonschema` and `re` for the outputs, plain torch for
the log-probabilities."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.engine.param_checks import ParamError, logit_bias  # noqa: E402
from llmkern.engine.structured_params import StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "temp"],
          "properties": {"city": {"type": "string", "maxLength": 16}, "temp": {"type": "number"},
                         "rain": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def llm():
    pytest.importorskip("xgrammar")
    from serve_helpers import require_default_model

    require_default_model()
    from llmkern import LLM

    return LLM(kv_cache_memory_gb=0.25, max_num_seqs=32)


def test_schema_regex_and_choice_hold_for_every_seed(llm):
    import jsonschema
    from llmkern import SamplingParams

    outs = llm.generate(["Weather report as JSON:"] * 24,
                        [SamplingParams(temperature=1.0, seed=s, max_tokens=80, structured_outputs={"json": SCHEMA})
                         for s in range(24)], use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert len(set(texts)) > 4
    for o in outs:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0]
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    rx = r"[A-Z][a-z]{2,8}-[0-9]{2}"
    outs = llm.generate(["Code:"] * 16, [SamplingParams(temperature=1.5, seed=s, max_tokens=16,
                                                        structured_outputs={"regex": rx}) for s in range(16)],
                        use_tqdm=False)
    assert all(re.fullmatch(rx, o.outputs[0].text) for o in outs), [o.outputs[0].text for o in outs]
    choices = ["red", "green", "blue", "light blue"]
    outs = llm.generate(["Pick a colour:"] * 16, [SamplingParams(temperature=2.0, seed=s, max_tokens=8,
                                                                 structured_outputs={"choice": choices})
                                                  for s in range(16)], use_tqdm=False)
    got = [o.outputs[0].text for o in outs]
    assert set(got) <= set(choices) and len(set(got)) > 1


def test_greedy_constrained_equals_the_best_allowed_continuation(llm):
    from llmkern import SamplingParams

    free = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    first = free[0].outputs[0].text
    forced = llm.generate(["The capital of France is"], SamplingParams(
        temperature=0, max_tokens=3, structured_outputs={"choice": [first, " Berlin"]}), use_tqdm=False)
    assert forced[0].outputs[0].text == first


def test_logit_bias_and_prompt_logprobs(llm):
    import torch
    from llmkern import SamplingParams

    o = llm.generate(["Hello"], SamplingParams(temperature=0.7, seed=1, max_tokens=4, logit_bias={"42": 100.0}),
                     use_tqdm=False)
    assert o[0].outputs[0].token_ids == [42] * 4
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    o = llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3), use_tqdm=False)
    plp = o[0].prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    with torch.inference_mode():   # reference: plain torch log_softmax over the model's own logits
        hidden, _ = llm.engine.runner.run_prompts([ids])
        logits = llm.engine.model.compute_logits(hidden, torch.arange(len(ids) - 1))
        ref = torch.log_softmax(logits.double(), -1)
    for i in range(1, len(ids)):
        lp, top = plp[i]
        assert lp == pytest.approx(ref[i - 1, ids[i]].item(), abs=1e-4)
        assert [t for t, _ in top] == ref[i - 1].topk(3).indices.tolist()


def test_bad_parameters_name_the_field(llm):
    from llmkern import SamplingParams

    for so, param in [({"regex": "("}, "structured_outputs.regex"), ({"json": {"type": "nope"}}, "structured_outputs.json"),
                      ({"grammar": "root ::= x"}, "structured_outputs.grammar")]:
        out = llm.generate(["x"], SamplingParams(max_tokens=2, structured_outputs=so), use_tqdm=False)[0]
        assert out.error.startswith(param + ":"), out.error
    with pytest.raises(ParamError, match="^structured_outputs: set exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})
    with pytest.raises(ParamError, match="^structured_outputs: unknown field 'jsn'"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(ParamError, match=r"^structured_outputs.choice: expected a non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ParamError, match="^logit_bias"):
        SamplingParams(logit_bias={"1": 101})
    with pytest.raises(ParamError, match="^logit_bias"):
        logit_bias({"49152": 1.0}, 49152)
    assert logit_bias({"7": 1, 8: -2.5}) == {7: 1.0, 8: -2.5}
    out = llm.generate(["x"], SamplingParams(max_tokens=2, logit_bias={10 ** 6: 1.0}), use_tqdm=False)[0]
    assert out.error.startswith("logit_bias"), out.error


def test_tool_call_parsing():
    from llmkern.serve.tools import ToolSpec, parse_tools

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "g"}}]
    auto = parse_tools({"tools": tools})
    content, calls = auto.extract('Sure.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n'
                                  '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    assert auto.extract('{"name": "f", "parameters": {"y": 2}}')[1][0]["function"]["arguments"] == '{"y": 2}'
    assert auto.extract("no calls here") == ("no calls here", [])
    assert auto.extract('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>')[1] == []
    req = ToolSpec(tools, "required")
    assert [c["function"]["name"] for c in req.extract('[{"name": "g", "parameters": {}}, {"name": "f", "param')[1]] \
        == ["g"]   # cut by max_tokens: the complete calls
    assert parse_tools({"tools": tools, "tool_choice": "none"}) is None
    named = parse_tools({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert named.constraint().json == {"type": "object", "properties": {}}
    assert named.extract('{"a": 1}')[1][0]["function"] == {"name": "g", "arguments": '{"a": 1}'}
    one = parse_tools({"tools": tools, "tool_choice": "required", "parallel_tool_calls": False})
    assert one.constraint().json["maxItems"] == 1
