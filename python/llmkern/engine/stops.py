"""Stop checks after a sequence got a token: stop strings (on the incrementally detokenised text),
EOS, stop token ids, max_tokens and the model's length."""
from __future__ import annotations

from typing import List, Optional

from .sequence import Sequence


def stop_reason(seq: Sequence, tok: int, eos_token_ids: List[int], max_model_len: int) -> Optional[str]:
    """The finish reason ("stop" / "length") if seq is done after its new token tok, else None.
    Extends seq.output_text (cut at a stop string) and sets seq.stop_reason."""
    p = seq.params
    n_out = seq.num_output_tokens
    if seq.detok is not None:
        delta = seq.detok.step(seq.output_token_ids)
        seq.output_text += delta
        if p.stop_list and n_out >= p.min_tokens and delta:
            # Only the new text (plus a look-back for stops spanning tokens) can hold a match.
            look = max(len(s) for s in p.stop_list) + len(delta)
            start = max(0, len(seq.output_text) - look)
            hits = [(seq.output_text.find(s, start), s) for s in p.stop_list]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                i, s = min(hits)
                seq.output_text = seq.output_text[:i + (len(s) if p.include_stop_str_in_output else 0)]
                seq.stop_reason = s
                return "stop"
    if n_out >= p.min_tokens:
        if not p.ignore_eos and tok in eos_token_ids:
            return "stop"
        if tok in p.stop_token_ids:
            seq.stop_reason = tok
            return "stop"
    if p.max_tokens is not None and n_out >= p.max_tokens:
        return "length"
    if seq.num_tokens >= max_model_len:
        return "length"
    return None
