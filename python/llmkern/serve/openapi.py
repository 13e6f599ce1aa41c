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
        "logit_bias": _opt({"type": "object", "maxProperties": 1024, "propertyNames": {"pattern": "^[0-9]+$"},
                            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
        # output constraints (structured_request.py): at most one per request
        "response_format": _opt({"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "properties": {"name": {"type": "string"}, "schema": {"type": "object"},
                                                             "strict": _BOOL}}}}),
        "structured_outputs": _opt({"type": "object"}),
        "guided_json": _opt({"anyOf": [{"type": "object"}, {"type": "string", "minLength": 1}]}),
        "guided_regex": _opt(nonempty), "guided_grammar": _opt(nonempty),
        "guided_choice": _opt({"type": "array", "minItems": 1, "items": {"type": "string"}}),
        "guided_whitespace_pattern": _opt({"type": "string"}),
        # OpenAI's deprecated function calling: accepted at its "off" value only
        "functions": _opt({"type": "array", "maxItems": 0}), "function_call": _opt({"enum": ["none"]}),
    }


def completion_request(max_tokens: int, max_n: int, vocab: int) -> dict:
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}
    text = {"type": "string", "minLength": 1}
    prompt = {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}, ids,
                        {"type": "array", "minItems": 1, "items": ids}]}
    props = dict(_sampling(max_tokens, max_n, vocab), prompt=prompt, logprobs=_int(0, MAX_LOGPROBS),
                 echo=_BOOL, best_of=_int(1, max_n), suffix=_opt({"type": "string"}))
    return {"type": "object", "required": ["prompt"], "properties": props, "additionalProperties": {"type": "null"}}


def chat_request(max_tokens: int, max_n: int, vocab: int) -> dict:
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role"],
               "properties": {"role": {"type": "string"},
                              "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                                    {"type": "array", "items": part}]},
                              "tool_calls": _opt({"type": "array", "items": {"type": "object"}}),
                              "tool_call_id": _opt({"type": "string"})}}
    tool = {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
            "parameters": {"type": "object"}}}}}
    choice = {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object", "required": ["type", "function"]}]}
    props = dict(_sampling(max_tokens, max_n, vocab), messages={"type": "array", "minItems": 1, "items": message},
                 max_completion_tokens=_int(1, max_tokens), logprobs=_BOOL, top_logprobs=_int(0, MAX_LOGPROBS),
                 tools=_opt({"type": "array", "items": tool}), tool_choice=_opt(choice), parallel_tool_calls=_BOOL)
    return {"type": "object", "required": ["messages"], "properties": props, "additionalProperties": {"type": "null"}}


ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_CHOICE = {"type": "object", "required": ["index", "finish_reason"],
           "properties": {"index": {"type": "integer"}, "text": {"type": "string"},
                          "finish_reason": {"enum": ["stop", "length", "tool_calls", None]}}}
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


def tokenize_request() -> dict:
    common = {"add_special_tokens": _BOOL, "return_token_strs": _BOOL, "model": _opt({"type": "string"})}
    message = {"type": "object", "required": ["role"], "properties": {"role": {"type": "string"},
                                                                      "content": _opt({"type": "string"})}}
    return {"anyOf": [
        {"type": "object", "required": ["prompt"], "properties": dict(common, prompt={"type": "string"}),
         "additionalProperties": {"type": "null"}},
        {"type": "object", "required": ["messages"], "additionalProperties": {"type": "null"},
         "properties": dict(common, add_generation_prompt=_BOOL,
                            messages={"type": "array", "minItems": 1, "items": message})}]}


def detokenize_request(vocab: int) -> dict:
    return {"type": "object", "required": ["tokens"], "properties": {
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}},
        "model": _opt({"type": "string"})}, "additionalProperties": {"type": "null"}}


def tokenizer_route_extra(request_schema: dict, response_schema: dict) -> dict:
    """openapi_extra of /tokenize and /detokenize."""
    err = {"content": {"application/json": {"schema": ERROR}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
            "responses": {"200": {"description": "the result", "content": {"application/json": {
                "schema": response_schema}}}, "400": dict(err, description="invalid request"),
                "404": dict(err, description="unknown model")}}
