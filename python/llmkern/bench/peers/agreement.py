"""Token agreement between two engines' greedy outputs for the same prompts."""
from __future__ import annotations

from typing import Sequence


def token_agreement(ref: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict:
    """prefix: fraction of ref's tokens inside the common prefix of each pair (everything after
    the first divergence counts as disagreement: greedy continuations of different tokens are
    unrelated); positionwise: fraction of positions holding the same token; identical: number of
    sequences equal as a whole, out of sequences."""
    if len(ref) != len(other):
        raise ValueError(f"other: {len(other)} sequences, ref has {len(ref)}")
    total = prefix = same = identical = 0
    for a, b in zip(ref, other):
        a, b = list(a), list(b)
        total += len(a)
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix += k
        same += sum(x == y for x, y in zip(a, b))
        identical += a == b
    return {"prefix": prefix / total if total else 1.0, "positionwise": same / total if total else 1.0,
            "identical": identical, "sequences": len(ref)}
