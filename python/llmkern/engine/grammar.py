"""Grammars for structured outputs, on xgrammar: a StructuredOutputsParams -> a compiled grammar
(cached by the constraint, so a schema sent by every request compiles once) -> one matcher per
sequence, which fills that row of a token bitmask and follows the tokens sampled.

xgrammar over llguidance (both maintained, both used by vLLM): on this package's default
tokenizer its masks cost ~5 us per token against llguidance's ~60-200 us (docs/serving.md has the
measurement); its cost is install size (it pulls triton on x86-64 Linux). Compilation errors
(a bad schema or regex) are ParamErrors naming the field."""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import List

from .param_checks import ParamError
from .structured_params import StructuredOutputsParams

INSTALL_HINT = "structured outputs need the xgrammar package: pip install 'llmkern[structured]'"


def _xgr():
    try:
        import xgrammar
    except ImportError:
        raise ParamError("structured_outputs", INSTALL_HINT) from None
    return xgrammar


def _hf_tokenizer(tokenizer):
    """The transformers fast tokenizer xgrammar reads the vocabulary from (ours wraps `tokenizers`)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer.tok)


def choice_grammar(choices: List[str]) -> str:
    """EBNF accepting exactly one of `choices` (JSON string escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer and vocabulary (the logits' width)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: List[int], cache_size: int = 256):
        if tokenizer is None:
            raise ParamError("structured_outputs", "this model was loaded without a tokenizer")
        self.xgr = _xgr()
        info = self.xgr.TokenizerInfo.from_huggingface(_hf_tokenizer(tokenizer), vocab_size=vocab_size,
                                                       stop_token_ids=list(eos_token_ids))
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._compiler = self.xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        # one C++ call fills every constrained row of a step; one thread, since it overlaps the forward
        self._batch = self.xgr.BatchGrammarMatcher(max_threads=1)
        self._cache: "OrderedDict[tuple, object]" = OrderedDict()
        self._lock = threading.Lock()
        self._size = cache_size

    def compile(self, so: StructuredOutputsParams):
        key = so.key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = self._compile(so, so.source)
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, so: StructuredOutputsParams, where: str):
        kind = so.kind
        c = self._compiler
        try:
            if kind == "json":
                return c.compile_json_schema(json.dumps(so.json), any_whitespace=so.whitespace_flexible)
            if kind == "json_object":   # an object, as OpenAI's JSON mode promises (not any JSON value)
                return c.compile_json_schema('{"type": "object"}', any_whitespace=so.whitespace_flexible,
                                             strict_mode=False)
            if kind == "regex":
                return c.compile_regex(so.regex)
            if kind == "choice":
                return c.compile_grammar(choice_grammar(so.choice))
            return c.compile_grammar(so.grammar)
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", msg)   # xgrammar's time and source location
            raise ParamError(f"{where}.{kind}", f"cannot be compiled: {msg[:300]}") from None

    def fill_rows(self, matchers: List["Matcher"], bitmask, rows: List[int]) -> None:
        self._batch.batch_fill_next_token_bitmask([m.m for m in matchers], bitmask, rows)

    def matcher(self, compiled) -> "Matcher":
        return Matcher(self.xgr.GrammarMatcher(compiled))


class Matcher:
    """One sequence's position in its grammar."""

    __slots__ = ("m",)

    def __init__(self, m):
        self.m = m

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.m.is_terminated()


def new_bitmask(rows: int, words: int):
    """int32 [rows, words], every token allowed (-1: all 32 bits set)."""
    import torch

    return torch.full((rows, words), -1, dtype=torch.int32)
