"""The body fields that constrain an output, as OpenAI and vLLM spell them, -> one
StructuredOutputsParams: `response_format` (json_object, json_schema), vLLM's `structured_outputs`
object and its older `guided_json|regex|choice|grammar` fields. Two at once is a 400 naming them."""
from __future__ import annotations

from typing import Optional

from ..engine.param_checks import ParamError, shown
from ..engine.structured_params import StructuredOutputsParams
from .errors import APIError, from_value_error

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
FIELDS = ("response_format", "structured_outputs", *GUIDED, "guided_whitespace_pattern")


def _response_format(rf) -> Optional[dict]:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise APIError(400, f"response_format: expected an object with a 'type', got {shown(rf)}",
                       param="response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise APIError(400, "response_format.json_schema: expected {name, schema, strict}",
                           param="response_format")
        # no schema: any JSON object, as OpenAI treats a schema-less json_schema
        return {"json": js["schema"]} if "schema" in js else {"json_object": True}
    raise APIError(400, f"response_format.type: expected text, json_object or json_schema, got {kind!r}",
                   param="response_format")


def structured_outputs(body: dict) -> Optional[StructuredOutputsParams]:
    """The request's constraint, or None."""
    given = []
    if body.get("response_format") is not None:
        d = _response_format(body["response_format"])
        if d is not None:
            given.append(("response_format", d))
    if body.get("structured_outputs") is not None:
        given.append(("structured_outputs", body["structured_outputs"]))
    for k, kind in GUIDED.items():
        if body.get(k) is not None:
            given.append((k, {kind: body[k]}))
    ws = body.get("guided_whitespace_pattern")
    if ws is not None and not isinstance(ws, str):
        raise APIError(400, f"guided_whitespace_pattern: expected a string, got {shown(ws)}",
                       param="guided_whitespace_pattern")
    if not given:
        return None
    if len(given) > 1:
        names = [g[0] for g in given]
        raise APIError(400, f"{names[1]}: only one output constraint per request (also got {names[0]})",
                       param=names[1])
    where, d = given[0]
    try:
        so = StructuredOutputsParams.coerce(d, where)
    except ParamError as e:
        raise from_value_error(e)
    if ws is not None:   # any pattern is taken as "whitespace allowed" (xgrammar has no custom pattern)
        so.whitespace_flexible = True
    return so
