"""Tokenizer: a `tokenizers` tokenizer plus the facts generation needs (BOS/EOS, chat template).

Built from a HF model directory (tokenizer.json, tokenizer_config.json) or from the vocabulary and
merges stored in a GGUF file (byte-level BPE, as written by llama.cpp's converter)."""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

# Pre-tokenizer regexes of the GGUF "tokenizer.ggml.pre" families (the split patterns of the
# original HF tokenizers); byte-level BPE models not listed use GPT-2's.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


class Tokenizer:
    def __init__(self, tok: HFTokenizer, eos_token_ids: Sequence[int] = (), bos_token_id: Optional[int] = None,
                 add_bos: bool = False, chat_template: Optional[str] = None,
                 special_tokens: Optional[Dict[str, str]] = None):
        self.tok = tok
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.special_tokens = special_tokens or {}
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        ids = self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None and (
                not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: List[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render a chat (list of {"role", "content"}) with the model's template (Jinja2 sandbox);
        `extra`: more template variables (e.g. `tools`)."""
        if not self.chat_template:
            raise ValueError("messages: this model has no chat template; pass a plain prompt string")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(msg):
                raise ValueError(f"messages: rejected by the chat template: {msg}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **self.special_tokens, **extra)

    def encode_chat(self, messages: List[dict]) -> List[int]:
        # The rendered template already holds any BOS text; do not add another.
        return self.encode_rendered(self.apply_chat_template(messages))

    def encode_rendered(self, text: str) -> List[int]:
        """Token ids of a rendered chat (which already holds any BOS text)."""
        bos = self.special_tokens.get("bos_token")
        return self.encode(text, add_special_tokens=not (bos and text.startswith(bos)))

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_hf_dir(cls, path: str) -> Optional["Tokenizer"]:
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tj):
            return None
        tok = HFTokenizer.from_file(tj)
        cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        gen = _read_json(os.path.join(path, "generation_config.json"))
        mcfg = _read_json(os.path.join(path, "config.json"))

        def token_str(x):
            return x.get("content") if isinstance(x, dict) else x

        specials = {k: token_str(cfg.get(k)) for k in ("bos_token", "eos_token") if cfg.get(k)}
        eos = gen.get("eos_token_id", mcfg.get("eos_token_id"))
        if eos is None and specials.get("eos_token"):
            eos = tok.token_to_id(specials["eos_token"])
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        bos = specials.get("bos_token")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(tok, eos, tok.token_to_id(bos) if bos else None, add_bos=bool(cfg.get("add_bos_token", False)),
                   chat_template=template, special_tokens=specials)

    @classmethod
    def from_gguf(cls, meta: dict) -> "Tokenizer":
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise NotImplementedError(
                f"model: GGUF tokenizer type {kind!r} is not supported (byte-level BPE 'gpt2' only)")
        tokens: List[str] = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in ("llama-bpe", "llama3"):
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre == "qwen2":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre == "smollm":  # GPT-2 splitting with every digit on its own
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        # Control (3) and user-defined (4) tokens are matched whole, never split by BPE.
        specials = [AddedToken(t, special=(ty == 3), normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
        if specials:
            tok.add_special_tokens(specials)
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        named = {}
        if bos is not None:
            named["bos_token"] = tokens[int(bos)]
        if eos is not None:
            named["eos_token"] = tokens[int(eos)]
        return cls(tok, [] if eos is None else [int(eos)], None if bos is None else int(bos),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=meta.get("tokenizer.chat_template"), special_tokens=named)


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
