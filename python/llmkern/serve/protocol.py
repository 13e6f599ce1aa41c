"""The OpenAI request bodies -> validated prompts and SamplingParams, and the response and
stream-chunk objects, shaped exactly as OpenAI's API returns them."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..engine.param_checks import INT64_MAX, INT64_MIN, ParamError, as_int, check_text, shown, token_ids
from ..engine.sampling_params import SamplingParams
from . import structured_request
from .errors import APIError, from_value_error
from .tools import ToolSpec, as_text_calls, parse_tools, template_takes_tools, with_tools

# Body fields mapped onto SamplingParams (same names), and those that are ours or OpenAI's and
# accepted without effect on sampling.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "n", "stop", "stop_token_ids", "seed", "ignore_eos", "min_tokens",
             "include_stop_str_in_output", "skip_special_tokens", "max_tokens")
_COMMON = ("model", "stream", "stream_options", "priority", "user", "logprobs", "logit_bias",
           "kv_transfer_params",   # prefill-decode hand-over (serve/pd.py checks it per role)
           *structured_request.FIELDS)
_COMPLETION_ONLY = ("prompt", "echo", "best_of", "suffix")
_CHAT_ONLY = ("messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls")
# Accepted only at their "off" value (an OpenAI client may send them explicitly).
_OFF_VALUES = {"functions": (None, []), "function_call": (None, "none")}


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
    tools: Optional[ToolSpec] = None            # chat with tools (tool_choice other than none)
    echo: bool = False                          # completions: the prompt leads each choice
    echo_only: bool = False                     # echo with max_tokens 0: the prompt alone
    best_of: Optional[int] = None               # completions: n of best_of samples, by log-probability
    requested_n: int = 1                        # the n asked for (params.n is best_of with best_of)
    user_logprobs: bool = True                  # False when logprobs were taken only to rank best_of
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
    if body.get("logit_bias") is not None:
        d["logit_bias"] = body["logit_bias"]
    d["structured_outputs"] = structured_request.structured_outputs(body)
    try:
        params = SamplingParams(**d)
        if vocab is not None:
            token_ids("stop_token_ids", params.stop_token_ids, vocab)
            if params.logit_bias:
                from ..engine.param_checks import logit_bias
                logit_bias(params.logit_bias, vocab)
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
    echo = flag(body, "echo")
    echo_only = echo and body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if echo_only:   # the prompt alone: one token is generated and left out of the response
        body = dict(body, max_tokens=1)
    if body.get("suffix") not in (None, ""):
        raw = [fill_in_middle(engine, p, body["suffix"]) for p in raw]
    params = _sampling(body, "completion", max_n, max_tokens_limit, engine)
    stream, include_usage, priority = _stream_flags(body)
    req = GenerationRequest("completion", [_tokenize(engine, p) for p in raw], params, stream, include_usage,
                            priority, body.get("model"), echo=echo, echo_only=echo_only)
    if echo and params.logprobs is not None:
        params.prompt_logprobs = params.logprobs
    _best_of(body, req, max_n)
    return req


def flag(body: dict, name: str, default: bool = False) -> bool:
    """A boolean body field (null or absent: `default`)."""
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(400, f"{name}: expected true or false, got {shown(v)}", param=name)
    return v


def check_model(model, served: str) -> None:
    """The body's `model`: absent, or the name this server serves (a 404 otherwise)."""
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"model: expected a string, got {shown(model)}", param="model")
    if model is not None and model != served:
        raise APIError(404, f"model: '{model}' does not exist (this server serves '{served}')", param="model",
                       code="model_not_found")


def _best_of(body: dict, req: GenerationRequest, max_n: int) -> None:
    """best_of: sample that many, return the n with the highest log-probability (OpenAI's)."""
    b = body.get("best_of")
    if b is None:
        return
    try:
        b = as_int("best_of", b, 1, max_n, f"an integer in [1, {max_n}]")
    except ValueError as e:
        raise from_value_error(e)
    p = req.params
    if b < p.n:
        raise APIError(400, f"best_of: must be >= n ({p.n}), got {b}", param="best_of")
    if b == p.n:
        return
    if req.stream:
        raise APIError(400, "best_of: not allowed with stream (the best are known only at the end)", param="best_of")
    req.best_of, req.user_logprobs, req.requested_n = b, p.logprobs is not None, p.n
    p.n = b
    if p.logprobs is None:
        p.logprobs = 0   # the sampled tokens' log-probabilities rank the samples


def fill_in_middle(engine, prompt, suffix) -> str:
    """`suffix`: the prompt in the prefix-suffix-middle form of a model with fill-in-the-middle
    tokens (StarCoder's names, which SmolLM2's vocabulary has too)."""
    if not isinstance(suffix, str):
        raise APIError(400, f"suffix: expected a string, got {shown(suffix)}", param="suffix")
    if not isinstance(prompt, str):
        raise APIError(400, "suffix: needs text prompts (not token ids)", param="suffix")
    tok = engine.tokenizer
    names = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    if tok is None or any(tok.tok.token_to_id(n) is None for n in names):
        raise APIError(400, "suffix: this model has no fill-in-the-middle tokens", param="suffix")
    return f"<fim_prefix>{check_text('prompt', prompt)}<fim_suffix>{check_text('suffix', suffix)}<fim_middle>"


def parse_chat(body: dict, engine, max_n: int, max_tokens_limit: int) -> GenerationRequest:
    _check_known(body, "chat")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages: expected a non-empty list of {role, content} objects", param="messages")
    flat = []
    template = getattr(engine.tokenizer, "chat_template", None)
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
        flat.append(_message(i, m, content, template))
    tools = parse_tools(body)
    if tools is not None:
        if tools.choice != "auto" and structured_request.structured_outputs(body) is not None:
            raise APIError(400, "tool_choice: a required or named tool call cannot be combined with "
                                "response_format / structured_outputs", param="tool_choice")
        msgs, extra = with_tools(flat, tools.tools, template)
        prompt = dict(messages=msgs, **extra)
    else:
        prompt = flat
    params = _sampling(body, "chat", max_n, max_tokens_limit, engine)
    if tools is not None and tools.constraint() is not None:
        params.structured_outputs = tools.constraint()
    stream, include_usage, priority = _stream_flags(body)
    return GenerationRequest("chat", [_tokenize(engine, prompt)], params, stream, include_usage, priority,
                             body.get("model"), tools=tools)


def _message(i: int, m: dict, content: str, template) -> dict:
    """A chat message for the template: role and content, and an assistant's earlier tool_calls
    (passed on to a template that renders them, else written into the content)."""
    out = {"role": m["role"], "content": content}
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise APIError(400, f"messages[{i}].tool_calls: expected a list of tool call objects", param="messages")
        if template_takes_tools(template):
            out["tool_calls"] = calls
        else:
            out["content"] = (content + "\n" if content else "") + as_text_calls(calls)
    for k in ("tool_call_id", "name"):
        if isinstance(m.get(k), str):
            out[k] = m[k]
    return out


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
    if req.kind != "chat" and any(e is None for e in lps):   # echo: the first prompt token has none
        d = logprobs_obj(req, tokenizer, ids, [e or (None, []) for e in lps], offset)
        d["top_logprobs"] = [None if e is None else t for e, t in zip(lps, d["top_logprobs"])]
        return d
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
    n = req.params.n if req.best_of is None else req.requested_n
    choices, p_tok, c_tok = [], 0, 0
    for pi, out in enumerate(outs):
        p_tok += len(out.prompt_token_ids)
        c_tok += sum(len(c.token_ids) for c in out.outputs)   # every best_of sample was generated
        for rank, c in enumerate(_chosen(req, out.outputs)):
            idx = pi * n + rank
            reason = finish_reason(c.finish_reason)
            if req.kind == "chat":
                msg = {"role": "assistant", "content": c.text}
                if req.tools is not None:
                    content, calls = req.tools.extract(c.text)
                    if calls:
                        msg = {"role": "assistant", "content": content, "tool_calls": calls}
                        reason = "stop" if req.tools.choice == "named" else "tool_calls"
                choices.append({"index": idx, "message": msg, "logprobs": logprobs_obj(req, tokenizer, c.token_ids,
                                                                                       c.logprobs),
                                "finish_reason": reason})
            else:
                text, ids, lps = echoed(req, out, c, tokenizer)
                choices.append({"index": idx, "text": text, "logprobs": logprobs_obj(req, tokenizer, ids, lps),
                                "finish_reason": reason})
    choices.sort(key=lambda c: c["index"])
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": req.response_id, "object": obj, "created": req.created, "model": model, "choices": choices,
            "usage": usage(p_tok, c_tok)}


def _chosen(req: GenerationRequest, outputs) -> list:
    """The completions to return: all, or with best_of the n of highest total log-probability."""
    if req.best_of is None:
        return sorted(outputs, key=lambda c: c.index)
    ranked = sorted(outputs, key=lambda c: -sum(lp for lp, _ in (c.logprobs or [])))
    return ranked[:req.requested_n]


def echoed(req: GenerationRequest, out, c, tokenizer):
    """(text, token ids, logprob entries or None) of a completions choice, the prompt leading it
    with echo; logprobs taken only to rank best_of are left out."""
    text, ids = c.text, list(c.token_ids)
    lps = c.logprobs if req.user_logprobs else None
    if req.echo_only:
        text, ids, lps = "", [], ([] if lps is not None else None)
    if req.echo:
        prompt_text = out.prompt if out.prompt is not None else (
            tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False) if tokenizer is not None else "")
        text, ids = prompt_text + text, list(out.prompt_token_ids) + ids
        if lps is not None:
            lps = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + list(lps)
    return text, ids, lps


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
