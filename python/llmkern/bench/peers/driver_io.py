"""The JSON-lines protocol between the bench and a peer driver, driver side.

A driver runs under the peer's own Python (its venv pins a torch that clashes with llmkern's), so
this file and the drivers import only the standard library and the peer: never llmkern.

One JSON object per line on stdin; one reply per line on the driver's private result channel
(the original stdout):

    {"op": "init", "model_dir": DIR, "dtype": "float32", "threads": 2, "options": {...}}
        -> {"ok": true, "info": {"peer": NAME, "version": V, "config": "..."}}
    {"op": "generate", "prompts": [[token ids], ...], "max_tokens": [n, ...], "fresh": true}
        -> {"ok": true, "seconds": S, "token_ids": [[greedy output ids], ...]}
    ("fresh": the peer's prefix cache is emptied first, outside the timed call, so a repeated
    workload is computed again rather than read from the previous run's cache.)
    {"op": "exit"} -> {"ok": true}

Any failure -> {"ok": false, "error": "..."}. "seconds" is the wall time of the generate call
alone (inside the driver: no pipe or JSON time), greedy, every output forced to its length."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def open_channel():
    """The result channel: a private copy of stdout. fd 1 then points at stderr, so whatever the
    peer prints (Python or C code, in this process or its children) cannot corrupt the protocol."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(init, generate, reset=None) -> int:
    """Answer requests until "exit" or end of input.

    init(msg) -> (state, info dict); generate(state, prompts, max_tokens) -> list of id lists;
    reset(state), where the peer keeps a prefix cache across calls: empty it."""
    out = open_channel()
    state = None
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = {"ok": True}
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "init":
                state, reply["info"] = init(msg)
            elif op == "generate":
                if state is None:
                    raise RuntimeError("generate before init")
                prompts, max_tokens = msg["prompts"], msg["max_tokens"]
                if len(prompts) != len(max_tokens):
                    raise ValueError(f"{len(prompts)} prompts but {len(max_tokens)} max_tokens")
                if msg.get("fresh") and reset is not None:
                    reset(state)
                t0 = time.perf_counter()
                ids = generate(state, prompts, max_tokens)
                reply["seconds"] = time.perf_counter() - t0
                reply["token_ids"] = [[int(t) for t in seq] for seq in ids]
            elif op == "exit":
                out.write(json.dumps(reply) + "\n")
                break
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # noqa: BLE001  (every failure becomes a reply; the bench decides)
            traceback.print_exc(file=sys.stderr)
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
    out.flush()
    return 0
