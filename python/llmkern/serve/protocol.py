"""The OpenAI request bodies -> validated prompts and SamplingParams, and the response and
stream-chunk objects, shaped exactly as OpenAI's API returns them."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..engine.param_checks import INT64_MAX, INT64_MIN, ParamError, as_int, check_text, shown, token_ids
from ..engine.sampling_params import SamplingParams
from .errors import APIError, from_value_error

# Body fields mapped onto SamplingParams (same names), and those that are ours or OpenAI's and
# accepted without effect on sampling.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "n", "stop", "stop_token_ids", "seed", "ignore_eos", "min_tokens",
             "include_stop_str_in_output", "skip_special_tokens", "max_tokens")
_COMMON = ("model", "stream", "stream_options", "priority", "user", "logprobs",
           "kv_transfer_params")   # prefill-decode hand-over (serve/pd.py checks it per role)
_COMPLETION_ONLY = ("prompt",)
_CHAT_ONLY = ("messages", "max_completion_tokens", "top_logprobs")
# Accepted only at their "off" value (an OpenAI client may send them explicitly).
_OFF_VALUES = {"echo": (None, False),
               "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
               "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
               "response_format": (None, {"type": "text"}), "functions": (None, [])}


@dataclass
class GenerationRequest:
    """One HTTP request, parsed: its prompts (text or None, token ids) and how to run them."""
    kind: str                                   # "completion" | "chat"
    prompts: List[Tuple[Optional[str], List[int]]]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    model: Optional[str] = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id


def _is_off(v, offs) -> bool:
    return any(v is o or (type(v) is type(o) and v == o) for o in offs)   # 0 is not False, 1.0 is not 1


def _check_known(body: dict, kind: str) -> None:
    known = set(_SAMPLING + _COMMON + (_CHAT_ONLY if kind == "chat" else _COMPLETION_ONLY))
    for k, v in body.items():
        if k in known:
            continue
        if k in _OFF_VALUES:
            if not _is_off(v, _OFF_VALUES[k]):
                raise APIError(400, f"{k}: not supported by this server (got {shown(v)})", param=k)
            continue
        if v is not None:
            raise APIError(400, f"{k}: unknown parameter", param=k)
    for k in ("model", "user"):
        if body.get(k) is not None and not isinstance(body[k], str):
            raise APIError(400, f"{k}: expected a string, got {shown(body[k])}", param=k)


def _sampling(body: dict, kind: str, max_n: int, max_tokens_limit: int, engine) -> SamplingParams:
    d = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    renamed = {}   # SamplingParams field -> the body field it came from, for the error's param
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        d["max_tokens"], renamed["max_tokens"] = body["max_completion_tokens"], "max_completion_tokens"
    if "max_tokens" not in d:   # chat: up to the context; completions: 16 (OpenAI's); within the server's limit
        context = getattr(engine, "max_model_len", None)
        if kind == "chat":
            d["max_tokens"] = max_tokens_limit if context is None or max_tokens_limit < context else None
        else:
            d["max_tokens"] = min(SamplingParams.max_tokens, max_tokens_limit)
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if kind == "chat":   # logprobs: bool, top_logprobs: how many alternatives
        if lp is not None and not isinstance(lp, bool):
            raise APIError(400, f"logprobs: expected true or false, got {shown(lp)}", param="logprobs")
        if top is not None and not lp:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        if lp:
            d["logprobs"], renamed["logprobs"] = (top if top is not None else 0), "top_logprobs"
    elif lp is not None:  # completions: logprobs = how many alternatives
        d["logprobs"] = lp
    vocab = getattr(getattr(engine, "model_config", None), "vocab_size", None)
    try:
        params = SamplingParams(**d)
        if vocab is not None:
            token_ids("stop_token_ids", params.stop_token_ids, vocab)
    except ValueError as e:
        err = from_value_error(e)
        if err.param in renamed:
            old, err.param = err.param, renamed[err.param]
            err.message = err.message.replace(f"{old}:", f"{err.param}:", 1)
        raise err
    if params.max_tokens is not None and params.max_tokens > max_tokens_limit:
        p = renamed.get("max_tokens", "max_tokens")
        raise APIError(400, f"{p}: at most {max_tokens_limit}, got {params.max_tokens}", param=p)
    if params.n > max_n:
        raise APIError(400, f"n: at most {max_n}, got {params.n}", param="n")
    return params


def _stream_flags(body: dict) -> Tuple[bool, bool, int]:
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise APIError(400, f"stream: expected true or false, got {shown(stream)}", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise APIError(400, f"stream_options: expected an object, got {shown(opts)}", param="stream_options")
    opts = {k: v for k, v in (opts or {}).items() if v is not None}
    if set(opts) - {"include_usage"}:
        raise APIError(400, f"stream_options: unknown option {sorted(set(opts) - {'include_usage'})[0]!r} "
                            "(known: include_usage)", param="stream_options")
    include_usage = opts.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError(400, f"stream_options.include_usage: expected true or false, got {shown(include_usage)}",
                       param="stream_options")
    if opts and not stream:
        raise APIError(400, "stream_options: only allowed with stream: true", param="stream_options")
    priority = body.get("priority") if body.get("priority") is not None else 0
    try:
        priority = as_int("priority", priority, INT64_MIN, INT64_MAX, "a 64-bit integer")
    except ValueError as e:
        raise from_value_error(e)
    return stream, include_usage, priority


def _is_ids(x) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_completion(body: dict, engine, max_n: int, max_tokens_limit: int) -> GenerationRequest:
    _check_known(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        raw = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        raw = list(prompt)
    else:
        raise APIError(400, "prompt: expected a non-empty string, list of strings, list of token ids or "
                            "list of token-id lists", param="prompt")
    params = _sampling(body, "completion", max_n, max_tokens_limit, engine)
    stream, include_usage, priority = _stream_flags(body)
    prompts = [_tokenize(engine, p) for p in raw]
    return GenerationRequest("completion", prompts, params, stream, include_usage, priority, body.get("model"))


def parse_chat(body: dict, engine, max_n: int, max_tokens_limit: int) -> GenerationRequest:
    _check_known(body, "chat")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages: expected a non-empty list of {role, content} objects", param="messages")
    flat = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}]: expected an object with a string 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):   # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content: expected a string or a list of text parts",
                           param="messages")
        for what, text in (("role", m["role"]), ("content", content)):
            try:
                check_text(f"messages[{i}].{what}", text)
            except ParamError as e:
                raise APIError(400, str(e), param="messages")
        flat.append({"role": m["role"], "content": content})
    params = _sampling(body, "chat", max_n, max_tokens_limit, engine)
    stream, include_usage, priority = _stream_flags(body)
    return GenerationRequest("chat", [_tokenize(engine, flat)], params, stream, include_usage, priority,
                             body.get("model"))


def _tokenize(engine, prompt) -> Tuple[Optional[str], List[int]]:
    try:
        text, ids = engine.tokenize(prompt)
    except (ValueError, TypeError) as e:
        raise from_value_error(e)
    if not ids:
        raise APIError(400, "prompt: is empty (0 tokens)", param="prompt")
    if len(ids) >= engine.max_model_len:
        raise APIError(413, f"prompt: {len(ids)} tokens, but the model's context is {engine.max_model_len} "
                            f"(at most {engine.max_model_len - 1} prompt tokens)", param="prompt",
                       code="context_length_exceeded")
    return text, ids


# -- responses -------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(r: Optional[str]) -> Optional[str]:
    return r if r in (None, "stop", "length") else "stop"


def token_str(tokenizer, tid: int) -> str:
    return tokenizer.decode([tid], skip_special_tokens=False) if tokenizer is not None else f"token_id:{tid}"


def logprobs_obj(req: GenerationRequest, tokenizer, ids, lps, offset: int = 0):
    """OpenAI's logprobs object for tokens `ids` with (logprob, [(id, logprob)]) entries `lps`:
    completions {tokens, token_logprobs, top_logprobs, text_offset}, chat {content: [...]}."""
    if lps is None:
        return None
    toks = [token_str(tokenizer, t) for t in ids]
    if req.kind == "chat":
        def entry(s, lp):
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        return {"content": [dict(entry(s, lp), top_logprobs=[entry(token_str(tokenizer, i), v) for i, v in top])
                            for s, (lp, top) in zip(toks, lps)]}
    offsets = []
    for s in toks:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": toks, "token_logprobs": [lp for lp, _ in lps],
            "top_logprobs": [{token_str(tokenizer, i): v for i, v in top} for _, top in lps],
            "text_offset": offsets}


def completion_response(req: GenerationRequest, model: str, outs, tokenizer=None) -> dict:
    """outs: the final RequestOutput of each prompt, in prompt order."""
    n = req.params.n
    choices, p_tok, c_tok = [], 0, 0
    for pi, out in enumerate(outs):
        p_tok += len(out.prompt_token_ids)
        for c in out.outputs:
            c_tok += len(c.token_ids)
            idx = pi * n + c.index
            lp = logprobs_obj(req, tokenizer, c.token_ids, c.logprobs)
            if req.kind == "chat":
                choices.append({"index": idx, "message": {"role": "assistant", "content": c.text},
                                "logprobs": lp, "finish_reason": finish_reason(c.finish_reason)})
            else:
                choices.append({"index": idx, "text": c.text, "logprobs": lp,
                                "finish_reason": finish_reason(c.finish_reason)})
    choices.sort(key=lambda c: c["index"])
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": req.response_id, "object": obj, "created": req.created, "model": model, "choices": choices,
            "usage": usage(p_tok, c_tok)}


def chunk(req: GenerationRequest, model: str, choices: list, usage_obj=None, with_usage_key: bool = False) -> dict:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    d = {"id": req.response_id, "object": obj, "created": req.created, "model": model, "choices": choices}
    if with_usage_key:
        d["usage"] = usage_obj
    return d


def delta_choice(req: GenerationRequest, index: int, text: Optional[str], reason: Optional[str],
                 role: bool = False, logprobs=None) -> dict:
    if req.kind == "chat":
        delta = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason(reason)}
    return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason(reason)}
