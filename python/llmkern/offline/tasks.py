"""What a job does with its lines: generation or embeddings. A task turns input items into result
records on a given LLM; the same code runs in the local job and inside each Ray actor."""
from __future__ import annotations

import json
from typing import Callable, List, Optional

from .jsonl import Item

PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")
EMBED_KEYS = ("input", "prompt", "text", "prompt_token_ids")
Emit = Callable[[Item, dict], None]


def error_record(item: Item, msg: str) -> dict:
    # A duplicate id's line is keyed by its number: its record must not claim the id.
    return {"line": item.line, "id": item.ident if item.key.startswith("id:") else None, "error": msg}


def to_prompt(obj, chat: bool, has_template: bool):
    """The engine prompt for one JSON value: a string, or an object with exactly one of 'prompt'
    (string), 'messages' (list of {"role", "content"} objects) or 'prompt_token_ids' (list of ints).
    Wrong types are errors, never reinterpreted."""
    if isinstance(obj, str):
        return [{"role": "user", "content": obj}] if chat and has_template else obj
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with a 'prompt', 'messages' or 'prompt_token_ids' field, "
                         f"got {type(obj).__name__}")
    keys = [k for k in PROMPT_KEYS if k in obj]
    if len(keys) != 1:
        found = (f"it has {' and '.join(repr(k) for k in keys)}" if keys else
                 f"it has none (fields: {', '.join(repr(k) for k in obj) or 'none'})")
        raise ValueError(f"prompt: a line needs exactly one of 'prompt', 'messages', 'prompt_token_ids'; {found}")
    k = keys[0]
    v = obj[k]
    if k == "prompt":
        if not isinstance(v, str):
            raise ValueError(f"'prompt' must be a string, got {type(v).__name__}")
        return to_prompt(v, chat, has_template)
    if k == "prompt_token_ids":
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise ValueError(f"'prompt_token_ids' must be a list of integers, got {_describe(v)}")
        return {k: v}
    if not isinstance(v, list) or not v or not all(isinstance(m, dict) for m in v):
        raise ValueError("'messages' must be a non-empty list of {\"role\", \"content\"} objects, "
                         f"got {_describe(v)}")
    return {k: v}


def _describe(v) -> str:
    return f"{type(v).__name__} {json.dumps(v)[:40]}"


def sampling_overrides(obj) -> dict:
    if not isinstance(obj, dict):
        return {}
    out = {k: v for k, v in obj.items() if k not in PROMPT_KEYS + ("id", "sampling_params")}
    extra = obj.get("sampling_params")
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"'sampling_params' must be an object, got {type(extra).__name__}")
    out.update(extra or {})
    return out


class GenerateTask:
    """Text generation. Records hold only what the request determines (text, tokens, finish reason,
    token counts; no timings), so a resumed job writes the same bytes as an uninterrupted one."""
    name = "generate"

    def __init__(self, sampling: Optional[dict] = None, chat: bool = True):
        self.sampling = dict(sampling or {})
        self.chat = chat

    def run(self, llm, items: List[Item], emit: Emit, on_tokens: Optional[Callable[[int, int], None]] = None) -> None:
        from ..engine import SamplingParams

        eng = llm.engine
        has_template = bool(llm.tokenizer and llm.tokenizer.chat_template)
        pending = {}
        for it in items:
            if it.error is not None:
                emit(it, error_record(it, it.error))
                continue
            try:
                prompt = to_prompt(it.obj, self.chat, has_template)   # first: a line without one says so
                sp = SamplingParams.from_dict({**self.sampling, **sampling_overrides(it.obj)})
                pending[eng.add_request(prompt, sp)] = it
            except Exception as e:  # a bad line is that line's problem alone
                emit(it, error_record(it, str(e) or type(e).__name__))
        try:
            self._loop(eng, pending, emit, on_tokens)
        except Exception as e:  # keep what finished; every unfinished line gets the error (retried on resume)
            msg = f"generation failed: {type(e).__name__}: {e}"
            for it in sorted(pending.values(), key=lambda it: it.line):
                emit(it, error_record(it, msg))
        finally:  # interrupted or failed: leave the engine clean
            for rid in pending:
                eng.abort(rid)

    @staticmethod
    def _loop(eng, pending, emit, on_tokens) -> None:
        while pending and eng.has_unfinished_requests():
            for out in eng.step():
                it = pending.pop(out.request_id, None) if out.finished else None
                if it is None:
                    continue
                m = out.metrics
                emit(it, {
                    "line": it.line, "id": it.ident, "text": out.text, "token_ids": out.token_ids,
                    "finish_reason": out.finish_reason,
                    "outputs": [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                                for c in out.outputs] if len(out.outputs) > 1 else None,
                    "metrics": {"prompt_tokens": m.num_prompt_tokens, "output_tokens": m.num_output_tokens},
                })
                if on_tokens is not None:
                    on_tokens(m.num_prompt_tokens, m.num_output_tokens)


class EmbedTask:
    """Embeddings (vLLM's embed shape): each line a string or an object with "input" (or "prompt",
    "text", "prompt_token_ids"); records {"line", "id", "embedding", "metrics": {"prompt_tokens"}}."""
    name = "embed"

    def __init__(self, pooling: str = "mean", normalize: bool = True):
        from ..engine.pooling import POOLINGS

        if pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.pooling, self.normalize = pooling, normalize

    def _tokens(self, llm, obj) -> List[int]:
        if isinstance(obj, dict):
            keys = [k for k in EMBED_KEYS if k in obj]
            if len(keys) != 1:
                raise ValueError("needs exactly one of " + ", ".join(repr(k) for k in EMBED_KEYS))
            v = obj[keys[0]]
            obj = {"prompt_token_ids": v} if keys[0] == "prompt_token_ids" else v
        if not isinstance(obj, (str, dict)):
            raise ValueError(f"expected a string or a JSON object, got {type(obj).__name__}")
        ids = llm.engine.tokenize(obj)[1]
        if not ids:
            raise ValueError("input: is empty (0 tokens)")
        if len(ids) > llm.engine.max_model_len:
            raise ValueError(f"input: {len(ids)} tokens, but the model allows at most {llm.engine.max_model_len}")
        return ids

    def run(self, llm, items: List[Item], emit: Emit, on_tokens: Optional[Callable[[int, int], None]] = None) -> None:
        from ..engine.prefill_tasks import embed, token_batches

        ok, toks = [], []
        for it in items:
            if it.error is not None:
                emit(it, error_record(it, it.error))
                continue
            try:
                toks.append(self._tokens(llm, it.obj))
                ok.append(it)
            except Exception as e:
                emit(it, error_record(it, str(e) or type(e).__name__))
        budget = llm.engine.config.max_num_batched_tokens
        for idx in token_batches([len(t) for t in toks], budget):
            try:
                vecs = embed(llm.engine, [toks[i] for i in idx], self.pooling, self.normalize)
            except Exception as e:  # that batch's lines get the error (retried on resume)
                for i in idx:
                    emit(ok[i], error_record(ok[i], f"embedding failed: {type(e).__name__}: {e}"))
                continue
            for i, v in zip(idx, vecs):
                emit(ok[i], {"line": ok[i].line, "id": ok[i].ident, "embedding": v.tolist(),
                             "metrics": {"prompt_tokens": len(toks[i])}})
                if on_tokens is not None:
                    on_tokens(len(toks[i]), 0)
