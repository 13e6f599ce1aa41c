"""Prompt processing: every accepted prompt form (text, token ids, chat messages, a dict with one
of them) turned into (text, token ids), with the errors naming what was wrong."""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

from .param_checks import check_text

PromptType = Union[str, List[int], dict, List[dict]]

_EXPECTED = {"prompt": "a string", "prompt_token_ids": "a list of token ids",
             "messages": "a non-empty list of {'role', 'content'} messages"}


def tokenize(prompt: PromptType, tokenizer, vocab_size: int) -> Tuple[Optional[str], List[int]]:
    """(prompt text or None, token ids) for a str, token-id list, chat (list of messages) or
    a dict with one of "prompt", "prompt_token_ids", "messages"; token ids checked against the
    vocabulary."""
    extra = {}
    if isinstance(prompt, dict):
        if prompt.get("tools") is not None and "messages" in prompt:   # rendered by a template that takes them
            extra["tools"] = prompt["tools"]
        keys = [k for k in ("prompt", "prompt_token_ids", "messages") if k in prompt]
        if len(keys) != 1:
            raise ValueError("prompt: a dict prompt needs exactly one of 'prompt', 'prompt_token_ids', 'messages'")
        key, prompt = keys[0], prompt[keys[0]]
        want = {"prompt": str, "prompt_token_ids": (list, tuple), "messages": (list, tuple)}[key]
        if not isinstance(prompt, want) or (key == "messages" and not (
                prompt and all(isinstance(m, dict) for m in prompt))):  # never reinterpreted
            raise TypeError(f"{key}: expected {_EXPECTED[key]}, got {type(prompt).__name__}")
    if isinstance(prompt, str):
        _need_tokenizer(tokenizer)
        return prompt, tokenizer.encode(check_text("prompt", prompt))
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        _need_tokenizer(tokenizer)
        for i, m in enumerate(prompt):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}]: expected {{'role': str, 'content': str}}, got {m!r}")
            check_text(f"messages[{i}].role", m["role"])
            check_text(f"messages[{i}].content", m["content"])
        text = tokenizer.apply_chat_template(list(prompt), **extra)
        return text, tokenizer.encode_rendered(text)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: token id {bad[0]} outside [0, {vocab_size})")
        return None, ids
    raise TypeError(f"prompt: expected a string, a list of token ids, a list of chat messages or a dict, "
                    f"got {type(prompt).__name__}")


def _need_tokenizer(tokenizer) -> None:
    if tokenizer is None:
        raise ValueError("prompt: this model has no tokenizer; pass token ids")
