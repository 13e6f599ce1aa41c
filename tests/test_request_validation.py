"""Request parameters are checked at the type the kernels store (fp32 / int32 / int64), in one
place shared by SamplingParams, the CLI and `llmkern serve`: every bad value is a ValueError (a
400 over HTTP) naming the field, values that round to 0 or inf in fp32 (the poison requests that
killed the engine) included, and the engine keeps serving. Also: deep JSON, /openapi.json, 405's
Allow, aborts in /metrics, LLM.generate with dicts, the unclear engine options."""
from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import LLM, SamplingParams, cli  # noqa: E402
from llmkern.engine.param_checks import ParamError  # noqa: E402

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)

# (field, bad value): each must be refused naming the field, in Python and over HTTP.
BAD = [
    ("repetition_penalty", 1e-50), ("repetition_penalty", 5e-324), ("repetition_penalty", 1e39),   # fp32 0 / inf
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("repetition_penalty", "2"),
    ("temperature", -0.5), ("temperature", 1e39), ("temperature", 10 ** 400), ("temperature", True),
    ("top_p", 0), ("top_p", 1e-50), ("top_p", 1.0000001), ("top_p", "0.5"),
    ("min_p", -0.1), ("min_p", 1.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -2.0001), ("frequency_penalty", 1e39),
    ("top_k", -2), ("top_k", 2 ** 70), ("top_k", 2.5), ("top_k", False),
    ("seed", 2 ** 64), ("seed", 2 ** 70), ("seed", -(2 ** 63) - 1), ("seed", 1.5), ("seed", "7"),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 2.5),
    ("min_tokens", -1), ("n", 0), ("n", 4.5), ("n", True),
    ("stop", 123), ("stop", [""]), ("stop", ["a", 5]), ("stop", "\ud800"), ("stop", ["ok", "x\udfff"]),
    ("stop_token_ids", 5), ("stop_token_ids", {}), ("stop_token_ids", ""), ("stop_token_ids", [-1]),
    ("stop_token_ids", [2 ** 40]), ("stop_token_ids", [1.5]),
    ("ignore_eos", "x"), ("ignore_eos", 1), ("include_stop_str_in_output", "yes"), ("skip_special_tokens", 0),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", True),
]
# Edge values that are valid and must stay accepted (stored as given, or normalised as shown).
GOOD = [
    ("n", 4.0, 4), ("max_tokens", 3.0, 3), ("top_k", -1, -1), ("top_k", 10 ** 12, 10 ** 12),
    ("seed", 2 ** 63 - 1, 2 ** 63 - 1), ("seed", -(2 ** 63), -(2 ** 63)), ("temperature", 0, 0.0),
    ("repetition_penalty", 1.5e-45, 1.5e-45), ("repetition_penalty", 3.4e38, 3.4e38), ("top_p", 1.5e-45, 1.5e-45),
    ("presence_penalty", -2, -2.0), ("min_p", 1, 1.0), ("logprobs", 20, 20), ("stop", ("a", "b"), ("a", "b")),
]


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v!r}"[:40] for f, v in BAD])
def test_sampling_params_refuse_naming_the_field(field, value):
    with pytest.raises(ParamError) as e:
        SamplingParams(**{field: value})
    assert isinstance(e.value, ValueError) and e.value.param == field
    assert str(e.value).startswith(f"{field}: ") and "expected" in str(e.value)


@pytest.mark.parametrize("field,value,stored", GOOD, ids=[f"{f}={v!r}" for f, v, _ in GOOD])
def test_sampling_params_accept_edge_values(field, value, stored):
    sp = SamplingParams(**{field: value})
    got = getattr(sp, field)
    assert got == stored and type(got) is type(stored)


def test_fp32_rounding_is_what_is_checked():
    # 1e-46 is > 0 as a float64 but 0 as the kernel's fp32; 1.5e-45 rounds to the smallest fp32 denormal.
    assert torch.tensor(1e-46, dtype=torch.float32).item() == 0.0
    assert torch.tensor(1.5e-45, dtype=torch.float32).item() > 0.0
    with pytest.raises(ParamError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-46)
    assert math.isinf(torch.tensor(3.5e38, dtype=torch.float32).item())
    with pytest.raises(ParamError, match="temperature"):
        SamplingParams(temperature=3.5e38)
    SamplingParams(temperature=3.4e38)


def test_min_tokens_above_max_tokens_and_from_dict():
    with pytest.raises(ParamError) as e:
        SamplingParams(min_tokens=5, max_tokens=2)
    assert e.value.param == "min_tokens"
    with pytest.raises(ParamError) as e:
        SamplingParams.from_dict({"tempreature": 0.5})
    assert e.value.param == "tempreature" and "known: " in str(e.value)


@pytest.mark.parametrize("argv,needle", [
    (["--repetition-penalty", "1e-50"], "--repetition-penalty: expected a finite number > 0"),
    (["--top-k", str(2 ** 70)], "--top-k: expected an integer >= 1"),
    (["--seed", str(2 ** 64)], "--seed: expected a 64-bit integer"),
    (["--max-tokens", "0"], "--max-tokens: expected an integer >= 1"),
    (["--temperature", "nan"], "--temperature: expected a finite number"),
    (["--max-model-len", "0"], "--max-model-len: expected an integer >= 1"),
    (["--num-gpu-blocks-override", "0"], "--num-gpu-blocks-override: expected an integer >= 1"),
])
def test_cli_refuses_with_the_same_checks(argv, needle, monkeypatch):
    monkeypatch.setattr("llmkern.engine.engine.load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "hello", *argv])
    msg = str(e.value.code)
    assert needle in msg and "\n" not in msg and "(self" not in msg   # one line, no pybind signature


def test_engine_options_zero_name_the_option():
    with pytest.raises(ValueError, match=r"^num_gpu_blocks: expected an integer >= 1"):
        LLM(dict(TINY), load_format="dummy", num_gpu_blocks=0)
    with pytest.raises(ValueError, match=r"^max_model_len: expected an integer >= 1"):
        LLM(dict(TINY), load_format="dummy", max_model_len=0)


@pytest.fixture(scope="module")
def tiny():
    return LLM(dict(TINY), load_format="dummy", num_gpu_blocks=64, block_size=4)


def _clean(engine):
    assert engine.kv.pool.num_used == 0 and not engine.scheduler.has_work and not engine.requests


def test_generate_takes_dicts_and_checks_all_before_admitting(tiny):
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outs = tiny.generate([[5, 6], [7, 8]], [sp, {"temperature": 0, "max_tokens": 4, "ignore_eos": True}],
                         use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in tiny.generate([[5, 6], [7, 8]], sp, use_tqdm=False)]
    assert tiny.generate([[5, 6]], {"temperature": 0, "max_tokens": 4, "ignore_eos": True},
                         use_tqdm=False)[0].token_ids == outs[0].token_ids
    for bad, param, exc in [({"temperature": 0.5, "top_p": 0}, "sampling_params[1].top_p", ValueError),
                            ({"wat": 1}, "sampling_params[1].wat", ValueError),
                            (7, "sampling_params[1]", TypeError)]:
        with pytest.raises(exc) as e:
            tiny.generate([[5, 6], [7, 8]], [sp, bad], use_tqdm=False)
        assert str(e.value).startswith(param + ":")
        if exc is ValueError:
            assert e.value.param == param
        _clean(tiny.engine)      # the valid first request was not admitted
    changed = SamplingParams(max_tokens=4)
    changed.repetition_penalty = 1e-50     # changed after construction: checked again
    with pytest.raises(ValueError, match=r"^sampling_params\.repetition_penalty:"):
        tiny.generate([[5, 6]], changed, use_tqdm=False)
    _clean(tiny.engine)


def test_prompt_with_a_lone_surrogate_is_an_error_naming_it():
    from llmkern.engine.processor import tokenize

    class Tok:     # reached only if the check let the text through
        def encode(self, s):
            return list(s.encode("utf-8"))

    with pytest.raises(ParamError) as e:
        tokenize("abc\ud800", Tok(), 128)
    assert e.value.param == "prompt" and "U+D800" in str(e.value)
    with pytest.raises(ParamError) as e:
        tokenize([{"role": "user", "content": "x\udc00"}], Tok(), 128)
    assert e.value.param == "messages[0].content"


def test_offline_line_without_a_prompt_names_it():
    from llmkern.offline.tasks import to_prompt

    with pytest.raises(ValueError, match=r"^prompt: a line needs exactly one of .*it has none \(fields: 'text'\)"):
        to_prompt({"text": "hello"}, chat=False, has_template=False)
    with pytest.raises(ValueError, match=r"^prompt: .*it has 'prompt' and 'messages'"):
        to_prompt({"prompt": "a", "messages": []}, chat=False, has_template=False)


def test_json_depth_counted_outside_strings():
    from llmkern.serve.json_body import nesting_depth

    for raw, want in [(b'{"a": [1, {"b": []}]}', 4), (b'{"p": "[[[[{{{{"}', 1), (b'{"p": "\\"[[", "q": [[]]}', 3),
                      (b"[" * 990 + b"]" * 990, 65), (b'"[[["', 0), (b"{}", 1)]:
        assert nesting_depth(raw, 64) == min(want, 65), raw[:30]
    assert nesting_depth(json.dumps({"m": [[[[1]]]]}).encode(), 64) == 5


# -- over HTTP ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    from serve_helpers import ServerProcess, tiny_model_dir

    d = tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))
    with ServerProcess(["--model", d, "--served-model-name", "tiny", "--kv-cache-memory-gb", "0.02",
                        "--max-num-seqs", "16"]) as s:
        yield s


def _post(server, body, path="/v1/completions", raw=None):
    import httpx

    # json.dumps escapes lone surrogates ("\\ud800"), as a client in another language may send them
    raw = json.dumps(body).encode() if raw is None else raw
    return httpx.post(server.base + path, content=raw, headers={"content-type": "application/json"}, timeout=60)


def _error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    e = resp.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    for internal in ("Traceback", "(self", "pybind", "ParamError", "SamplingParams", "llmkern."):
        assert internal not in e["message"], e["message"]
    return e


def _alive(server):
    import httpx

    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    r = _post(server, {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v!r}"[:40] for f, v in BAD])
def test_http_400_names_the_field(server, field, value):
    e = _error(_post(server, {"prompt": "Hello", "max_tokens": 3, field: value}), 400)
    assert e["param"] == field and e["message"].startswith(f"{field}: ") and e["type"] == "invalid_request_error"


def test_poison_values_are_400_and_the_engine_keeps_serving(server):
    for v in (1e-50, 5e-324, 1e39):
        e = _error(_post(server, {"prompt": "Hello", "max_tokens": 3, "repetition_penalty": v}), 400)
        assert e["param"] == "repetition_penalty"
        e = _error(_post(server, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                                  "repetition_penalty": v, "stream": True}, "/v1/chat/completions"), 400)
        assert e["param"] == "repetition_penalty"
    _alive(server)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "x"}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "us\udfffer", "content": "a"}]}, "messages"),
    ("/v1/completions", {"prompt": "Hel\ud800lo"}, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "\udc80"]}, "prompt"),
    ("/v1/completions", {"stop_token_ids": [300]}, "stop_token_ids"),     # past the vocabulary (260)
    ("/v1/completions", {"model": 5}, "model"),
    ("/v1/completions", {"user": ["x"]}, "user"),
    ("/v1/completions", {"stream": True, "stream_options": {"include_usage": "x"}}, "stream_options"),
    ("/v1/completions", {"stream": True, "stream_options": {"wat": True}}, "stream_options"),
    ("/v1/completions", {"stream": 1}, "stream"),
    ("/v1/completions", {"echo": 0}, "echo"),
    ("/v1/completions", {"best_of": True}, "best_of"),
    ("/v1/completions", {"priority": 2 ** 70}, "priority"),
    ("/v1/completions", {"n": 10 ** 30}, "n"),
    ("/v1/completions", {"max_tokens": 10 ** 30}, "max_tokens"),
])
def test_http_400_for_the_other_fields(server, path, body, param):
    base = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hello"}
    e = _error(_post(server, {**base, "max_tokens": 3, **body}, path), 400)
    assert e["param"] == param


def test_http_edge_values_accepted(server):
    r = _post(server, {"prompt": "Hello", "max_tokens": 3, "n": 4.0, "temperature": 1.0, "seed": 2 ** 63 - 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 4
    for extra in ({"repetition_penalty": 1.5e-45}, {"repetition_penalty": 3.4e38, "min_p": 1},
                  {"top_p": 1.5e-45, "top_k": 10 ** 12}, {"max_tokens": 3.0, "ignore_eos": True}):
        r = _post(server, dict({"prompt": "Hello", "max_tokens": 3}, **extra))
        assert r.status_code == 200, (extra, r.text)
    _alive(server)


def test_deep_json_is_a_400_before_parsing(server):
    for raw in (b"[" * 990 + b"]" * 990, b'{"prompt": "a", "x": ' + b"[" * 70 + b"]" * 70 + b"}",
                b'{"prompt": "a", "x": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}"):
        e = _error(_post(server, None, raw=raw), 400)
        assert e["param"] == "body" and "nested deeper than 64" in e["message"]
    ok = b'{"prompt": "Hello", "max_tokens": 2, "x": null, "stop": ["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]}'
    assert _post(server, None, raw=ok).status_code == 200
    _alive(server)


def test_openapi_describes_the_request_bodies_and_405_has_allow(server):
    import httpx

    spec = httpx.get(server.base + "/openapi.json", timeout=10).json()
    for path, required in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")):
        op = spec["paths"][path]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema["required"] == [required] and "repetition_penalty" in schema["properties"]
        assert {"200", "400", "413"} <= set(op["responses"])
    assert spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["max_tokens"]["anyOf"][0]["maximum"] == 512     # the context of the served model
    r = httpx.get(server.base + "/v1/completions", timeout=10)
    _error(r, 405)
    assert r.headers["allow"] == "POST"


def test_client_disconnect_counted_as_abort(server):
    import time

    import httpx

    key = ("llmkern:request_success_total", (("finished_reason", "abort"),))
    before = server.metrics().get(key, 0)
    body = {"prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())          # the request is running: leave
    deadline = time.monotonic() + 60
    while server.metrics().get(key, 0) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metrics().get(key, 0) == before + 1
    _alive(server)
