"""The OpenAPI description of the generation routes' request and response bodies (the routes read
their bodies themselves, protocol.py checks them): the same fields, types and ranges, so that a
schema-driven client or fuzzer sees what the server accepts. Fields not listed are accepted only
as null (an OpenAI client may send any of its fields explicitly unset)."""
from __future__ import annotations

from ..engine.param_checks import INT64_MAX, INT64_MIN
from ..engine.sampling_params import MAX_LOGPROBS

FLT_MAX = 3.4028234663852886e38          # largest finite fp32
FLT_TRUE_MIN = 1.401298464324817e-45     # smallest positive fp32: anything above rounds to > 0


def _opt(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _num(lo: float, hi: float) -> dict:
    return _opt({"type": "number", "minimum": lo, "maximum": hi})


def _int(lo: int, hi: int) -> dict:
    return _opt({"type": "integer", "minimum": lo, "maximum": hi})


_BOOL = _opt({"type": "boolean"})


def _sampling(max_tokens: int, max_n: int, vocab: int) -> dict:
    nonempty = {"type": "string", "minLength": 1}
    return {
        "model": _opt({"type": "string"}), "user": _opt({"type": "string"}),
        "max_tokens": _int(1, max_tokens), "min_tokens": _int(0, max_tokens),
        "temperature": _num(0.0, FLT_MAX), "top_p": _num(FLT_TRUE_MIN, 1.0), "min_p": _num(0.0, 1.0),
        "top_k": _int(-1, INT64_MAX), "repetition_penalty": _num(FLT_TRUE_MIN, FLT_MAX),
        "presence_penalty": _num(-2.0, 2.0), "frequency_penalty": _num(-2.0, 2.0), "n": _int(1, max_n),
        "stop": _opt({"anyOf": [nonempty, {"type": "array", "items": nonempty}]}),
        "stop_token_ids": _opt({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}),
        "seed": _int(INT64_MIN, INT64_MAX), "priority": _int(INT64_MIN, INT64_MAX),
        "ignore_eos": _BOOL, "include_stop_str_in_output": _BOOL, "skip_special_tokens": _BOOL, "stream": _BOOL,
        "stream_options": _opt({"type": "object", "properties": {"include_usage": _BOOL},
                                "additionalProperties": {"type": "null"}}),
        # OpenAI's fields this server accepts at their "off" value only
        "echo": _opt({"enum": [False]}), "best_of": _opt({"enum": [1]}), "suffix": _opt({"enum": [""]}),
        "logit_bias": _opt({"type": "object", "maxProperties": 0}), "tools": _opt({"type": "array", "maxItems": 0}),
        "functions": _opt({"type": "array", "maxItems": 0}), "tool_choice": _opt({"enum": ["none"]}),
        "response_format": _opt({"type": "object", "properties": {"type": {"enum": ["text"]}}, "required": ["type"],
                                 "additionalProperties": False}),
    }


def completion_request(max_tokens: int, max_n: int, vocab: int) -> dict:
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}
    text = {"type": "string", "minLength": 1}
    prompt = {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}, ids,
                        {"type": "array", "minItems": 1, "items": ids}]}
    props = dict(_sampling(max_tokens, max_n, vocab), prompt=prompt, logprobs=_int(0, MAX_LOGPROBS))
    return {"type": "object", "required": ["prompt"], "properties": props, "additionalProperties": {"type": "null"}}


def chat_request(max_tokens: int, max_n: int, vocab: int) -> dict:
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role"],
               "properties": {"role": {"type": "string"},
                              "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                                    {"type": "array", "items": part}]}}}
    props = dict(_sampling(max_tokens, max_n, vocab), messages={"type": "array", "minItems": 1, "items": message},
                 max_completion_tokens=_int(1, max_tokens), logprobs=_BOOL, top_logprobs=_int(0, MAX_LOGPROBS))
    return {"type": "object", "required": ["messages"], "properties": props, "additionalProperties": {"type": "null"}}


ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_CHOICE = {"type": "object", "required": ["index", "finish_reason"],
           "properties": {"index": {"type": "integer"}, "text": {"type": "string"},
                          "finish_reason": {"enum": ["stop", "length", None]}}}
COMPLETION = {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
              "properties": {"id": {"type": "string"}, "object": {"enum": ["text_completion", "chat.completion"]},
                             "created": {"type": "integer"}, "model": {"type": "string"},
                             "choices": {"type": "array", "items": _CHOICE},
                             "usage": {"type": "object",
                                       "required": ["prompt_tokens", "completion_tokens", "total_tokens"]}}}


# one Server-Sent Event: `data:` a chunk as JSON, an error object, or [DONE]
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def route_extra(request_schema: dict) -> dict:
    """FastAPI's openapi_extra of a generation route: its request body and its responses."""
    err = {"content": {"application/json": {"schema": ERROR}}}
    responses = {"200": {"description": "the completion (JSON), or its Server-Sent Events with stream: true",
                         "content": {"application/json": {"schema": COMPLETION},
                                     "text/event-stream": {"schema": _EVENT}}}}
    for code, why in (("400", "invalid request"), ("401", "missing or invalid API key"), ("404", "unknown model"),
                      ("413", "body or prompt too long"), ("429", "too many requests queued"),
                      ("500", "the request failed in the engine"), ("503", "shutting down, engine not running or "
                                                                           "queue timeout")):
        responses[code] = dict(err, description=why)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
            "responses": responses}
