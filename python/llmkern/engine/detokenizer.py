"""Incremental detokenization: new text per generated token without re-decoding the whole output,
holding back bytes of an incomplete UTF-8 character; and how much streamed text to hold back while it
could still turn out to be the start of a stop string."""
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


def stop_holdback(text: str, stops: List[str]) -> int:
    """Number of characters at the end of `text` that could still begin one of `stops` (the longest
    suffix of text that is a proper prefix of a stop string). Streaming sends them only once the next
    tokens show they are not a stop, so a stop spanning two tokens never leaks into the stream."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
