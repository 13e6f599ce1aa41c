"""Incremental detokenization: new text per generated token without re-decoding the whole output,
holding back bytes of an incomplete UTF-8 character."""
from __future__ import annotations

from typing import List


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.prefix_offset = 0   # window start (context for correct spacing)
        self.read_offset = 0     # tokens already turned into text

    def step(self, output_ids: List[int]) -> str:
        dec = self.tokenizer.decode
        prefix = dec(output_ids[self.prefix_offset:self.read_offset], skip_special_tokens=self.skip)
        full = dec(output_ids[self.prefix_offset:], skip_special_tokens=self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(output_ids)
            return full[len(prefix):]
        return ""
