"""StructuredOutputsParams: what a request's output must match (vLLM's field names): a JSON schema,
any JSON object, a regular expression, one of a list of strings, or an EBNF grammar. Exactly one
is set. The grammar itself is compiled by grammar.py; here only the shape is checked, so a bad
value is a ParamError naming the field before anything is queued."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import List, Optional, Union

from .param_checks import ParamError, check_text, shown

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: Union[None, str, dict] = None        # a JSON schema (object or its JSON text)
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None               # EBNF (GBNF, as llama.cpp and xgrammar write it)
    json_object: Optional[bool] = None          # any JSON object (OpenAI's "json_object" mode)
    whitespace_flexible: bool = False           # let the schema's JSON carry any whitespace
    source: str = field(default="structured_outputs", repr=False, compare=False)   # the field errors name

    def __post_init__(self):
        self.validate()

    def validate(self, where: str = "structured_outputs") -> None:
        chosen = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(chosen) != 1:
            raise ParamError(where, f"set exactly one of {', '.join(KINDS)}, got "
                                    f"{', '.join(chosen) if chosen else 'none'}")
        kind = chosen[0]
        name = f"{where}.{kind}"
        v = getattr(self, kind)
        if kind == "json":
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except ValueError as e:
                    raise ParamError(name, f"not valid JSON: {e}") from None
            if not isinstance(v, dict):
                raise ParamError(name, f"expected a JSON schema (an object), got {shown(v)}")
            self.json = v
        elif kind == "choice":
            if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
                raise ParamError(name, f"expected a non-empty list of strings, got {shown(v)}")
            for i, c in enumerate(v):
                check_text(f"{name}[{i}]", c)
        elif kind == "json_object":
            if v is not True:
                raise ParamError(name, f"expected true, got {shown(v)}")
        else:
            if not isinstance(v, str) or not v:
                raise ParamError(name, f"expected a non-empty string, got {shown(v)}")
            check_text(name, v)
        if not isinstance(self.whitespace_flexible, bool):
            raise ParamError(f"{where}.whitespace_flexible", f"expected true or false, got "
                                                             f"{shown(self.whitespace_flexible)}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple:
        """A hashable identity of the constraint (the grammar cache's key)."""
        v = getattr(self, self.kind)
        if isinstance(v, (dict, list)):
            v = json.dumps(v, sort_keys=True)
        return self.kind, v, self.whitespace_flexible

    @classmethod
    def coerce(cls, v, where: str = "structured_outputs") -> Optional["StructuredOutputsParams"]:
        """None, an instance, or a dict with the field names (unknown keys are an error)."""
        if v is None or isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise ParamError(where, f"expected an object, got {shown(v)}")
        names = {f.name for f in fields(cls) if f.name != "source"}
        unknown = sorted(set(v) - names)
        if unknown:
            raise ParamError(where, f"unknown field {unknown[0]!r}; known: {', '.join(sorted(names))}")
        out = cls.__new__(cls)
        for f in fields(cls):
            setattr(out, f.name, v.get(f.name, f.default))
        out.source = where
        out.validate(where)
        return out
