"""The tokenizer endpoints vLLM's server has and its users script against (lm-eval's remote
tokenizer among them): POST /tokenize, POST /detokenize, GET /tokenizer_info, and GET /version."""
from __future__ import annotations

from fastapi import Request

from ..engine.param_checks import INT32_MAX, check_text, shown, token_ids
from . import openapi
from .errors import APIError, from_value_error
from .json_body import read_json
from .protocol import check_model, flag


def add_tokenizer_routes(app, engine, model_name: str, max_body_bytes: int) -> None:
    def tokenizer():
        if engine.tokenizer is None:
            raise APIError(400, "this model was loaded without a tokenizer", param="model")
        return engine.tokenizer

    def check_body(body: dict, known) -> None:
        for k, v in body.items():
            if k not in known and v is not None:
                raise APIError(400, f"{k}: unknown parameter", param=k)
        check_model(body.get("model"), model_name)

    # an engine stand-in (tests, other fronts) may not say; token ids are then checked as int32
    vocab = getattr(getattr(engine, "model_config", None), "vocab_size", INT32_MAX + 1)
    ids = {"type": "array", "items": {"type": "integer"}}

    @app.post("/tokenize", openapi_extra=openapi.tokenizer_route_extra(openapi.tokenize_request(), {
        "type": "object", "required": ["count", "tokens"], "properties": {"count": {"type": "integer"}, "tokens": ids}}))
    async def tokenize(request: Request):
        body = await read_json(request, max_body_bytes)
        chat = body.get("messages") is not None
        check_body(body, ("model", "add_special_tokens", "return_token_strs")
                    + (("messages", "add_generation_prompt") if chat else ("prompt",)))
        tok = tokenizer()
        try:
            if chat:
                msgs = body["messages"]
                if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                    raise APIError(400, "messages: expected a non-empty list of {role, content} objects",
                                   param="messages")
                for i, m in enumerate(msgs):
                    if not isinstance(m.get("role"), str) or not isinstance(m.get("content", ""), (str, type(None))):
                        raise APIError(400, f"messages[{i}]: expected {{role: string, content: string}}",
                                       param="messages")
                msgs = [{"role": check_text(f"messages[{i}].role", m["role"]),
                         "content": check_text(f"messages[{i}].content", m.get("content") or "")}
                        for i, m in enumerate(msgs)]
                try:
                    text = tok.apply_chat_template(msgs, add_generation_prompt=flag(body, "add_generation_prompt",
                                                                                     True))
                except ValueError:
                    raise
                except Exception as e:  # noqa: BLE001 - the template (user-facing Jinja) failed on this input
                    raise APIError(400, f"messages: the chat template failed on them ({type(e).__name__})",
                                   param="messages")
                # the rendered chat holds its BOS text already: added again only when asked
                ids = tok.encode(text) if flag(body, "add_special_tokens", False) else tok.encode_rendered(text)
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise APIError(400, f"prompt: expected a string, got {shown(prompt)}", param="prompt")
                ids = tok.encode(check_text("prompt", prompt), add_special_tokens=flag(body, "add_special_tokens",
                                                                                         True))
        except ValueError as e:
            raise from_value_error(e)
        strs = [tok.decode([t], skip_special_tokens=False) for t in ids] if flag(body, "return_token_strs",
                                                                                 False) else None
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", openapi_extra=openapi.tokenizer_route_extra(openapi.detokenize_request(vocab), {
        "type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}))
    async def detokenize(request: Request):
        body = await read_json(request, max_body_bytes)
        check_body(body, ("model", "tokens"))
        try:
            ids = token_ids("tokens", body.get("tokens"), vocab)
        except ValueError as e:
            raise from_value_error(e)
        return {"prompt": tokenizer().decode(ids, skip_special_tokens=False)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok = tokenizer()
        sp = tok.special_tokens
        return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": sp.get("eos_token"),
                "bos_token": sp.get("bos_token"), "pad_token": sp.get("pad_token"),
                "chat_template": tok.chat_template, "model_max_length": engine.max_model_len,
                "vocab_size": vocab}

    @app.get("/version")
    async def version():
        from .. import __version__

        return {"version": __version__}
