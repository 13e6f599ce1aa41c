"""Tool calling for chat completions, as OpenAI and vLLM do it.

- `tools` + `tool_choice`: "none" (no calls), "auto" (the model decides; its text is parsed for
  calls), "required" (at least one call) or {"type": "function", "function": {"name"}} (that one).
  Required and named calls are constrained by grammar to the tools' JSON schemas (vLLM's way), so
  they always parse; `parallel_tool_calls: false` allows one call.
- The tools reach the model through its chat template when the template takes `tools`; a template
  that does not gets a system message describing them in the Hermes format
  (`<tool_call>{"name", "arguments"}</tool_call>`), which the "auto" parser reads back. A bare JSON
  object {"name", "arguments"|"parameters"} naming a tool (Llama 3.1's format) is read too."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..engine.param_checks import shown
from ..engine.structured_params import StructuredOutputsParams
from .errors import APIError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _err(msg: str, param: str = "tools") -> APIError:
    return APIError(400, msg, param=param)


@dataclass
class ToolSpec:
    tools: List[dict]                 # OpenAI's tool objects, checked
    choice: str                       # "auto" | "required" | "named"
    named: Optional[str] = None
    parallel: bool = True

    @property
    def schemas(self) -> dict:
        return {t["function"]["name"]: t["function"].get("parameters") or {"type": "object", "properties": {}}
                for t in self.tools}

    def constraint(self) -> Optional[StructuredOutputsParams]:
        """The grammar of a required or named call (None for auto)."""
        if self.choice == "named":
            return StructuredOutputsParams(json=self.schemas[self.named], source="tools")
        if self.choice == "required":
            one = [{"type": "object", "properties": {"name": {"const": n}, "parameters": s},
                    "required": ["name", "parameters"], "additionalProperties": False}
                   for n, s in self.schemas.items()]
            arr = {"type": "array", "minItems": 1, "items": {"anyOf": one}}
            if not self.parallel:
                arr["maxItems"] = 1
            return StructuredOutputsParams(json=arr, source="tools")
        return None

    def extract(self, text: str) -> Tuple[Optional[str], List[dict]]:
        """(content, tool_calls) of a finished output."""
        if self.choice == "named":
            return None, [_call(self.named, text)]
        if self.choice == "required":
            items = _leading_items(text)   # cut short by max_tokens: the calls completed before the cut
            if not items:
                return text, []
            return None, [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in items]
        return self._parse_auto(text)

    def _parse_auto(self, text: str) -> Tuple[Optional[str], List[dict]]:
        names = set(self.schemas)
        calls = []
        start = text.find("<tool_call>")
        if start >= 0:
            for body in _CALL.findall(text[start:]):
                c = _loads_call(body, names)
                if c is not None:
                    calls.append(c)
            content = text[:start].strip() or None
        else:
            c = _loads_call(text.strip(), names)
            if c is not None:
                calls, content = [c], None
            else:
                content = text
        if not self.parallel:
            calls = calls[:1]
        return (content, calls) if calls else (text, [])


def _leading_items(text: str) -> list:
    """The complete elements at the start of a JSON array, which may be cut off after them."""
    dec, items = json.JSONDecoder(), []
    i = text.find("[") + 1
    if i == 0:
        return items
    while True:
        while i < len(text) and text[i] in " \t\n\r,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return items
        items.append(obj)


def _loads_call(body: str, names) -> Optional[dict]:
    try:
        d = json.loads(body)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("name") not in names:
        return None
    args = d.get("arguments", d.get("parameters", {}))
    if isinstance(args, str):
        return _call(d["name"], args)
    return _call(d["name"], json.dumps(args, ensure_ascii=False))


def _call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def parse_tools(body: dict) -> Optional[ToolSpec]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    par = body.get("parallel_tool_calls")
    if par is not None and not isinstance(par, bool):
        raise _err(f"parallel_tool_calls: expected true or false, got {shown(par)}", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise _err("tool_choice: needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise _err(f"tools: expected a list of tool objects, got {shown(tools)}")
    seen = set()
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(f, dict):
            raise _err(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{...}}}}")
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _err(f"tools[{i}].function.name: expected 1-64 letters, digits, '_' or '-', got {shown(name)}")
        if name in seen:
            raise _err(f"tools[{i}].function.name: {name!r} is given twice")
        seen.add(name)
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise _err(f"tools[{i}].function.parameters: expected a JSON schema object")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise _err(f"tools[{i}].function.description: expected a string")
    if choice is None:
        choice = "auto"
    if choice == "none":
        return None
    if choice in ("auto", "required"):
        return ToolSpec(tools, choice, parallel=par is not False)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(name, str)):
        raise _err(f"tool_choice: expected none, auto, required or {{\"type\": \"function\", \"function\": "
                   f"{{\"name\"}}}}, got {shown(choice)}", "tool_choice")
    if name not in seen:
        raise _err(f"tool_choice.function.name: {name!r} is not one of the tools", "tool_choice")
    return ToolSpec(tools, "named", named=name, parallel=False)


def system_prompt(tools: List[dict]) -> str:
    """For templates that take no `tools`: the tools and the call format, as a system message."""
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You may call the functions described below (JSON schemas) to help with the user's request.\n"
            f"<tools>\n{lines}\n</tools>\n"
            "To call one, reply with one block per call and nothing else:\n"
            '<tool_call>{"name": "<function name>", "arguments": {<the arguments as JSON>}}</tool_call>')


def template_takes_tools(template: Optional[str]) -> bool:
    return bool(template) and "tools" in template


def with_tools(messages: List[dict], tools: List[dict], template: Optional[str]) -> Tuple[List[dict], dict]:
    """(messages, extra template variables) that show the model its tools."""
    if template_takes_tools(template):
        return messages, {"tools": tools}
    msgs = list(messages)
    sysmsg = system_prompt(tools)
    if msgs and msgs[0]["role"] == "system":
        msgs[0] = dict(msgs[0], content=msgs[0]["content"] + "\n\n" + sysmsg)
    else:
        msgs.insert(0, {"role": "system", "content": sysmsg})
    return msgs, {}


def as_text_calls(calls: list) -> str:
    """An assistant message's earlier tool_calls, written back in the Hermes format for templates
    that do not render tool_calls themselves."""
    out = []
    for c in calls:
        f = c.get("function", {}) if isinstance(c, dict) else {}
        args = f.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        out.append("<tool_call>" + json.dumps({"name": f.get("name"), "arguments": args}, ensure_ascii=False)
                   + "</tool_call>")
    return "\n".join(out)
