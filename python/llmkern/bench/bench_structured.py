"""Structured-output overhead on one server: the same 32 concurrent chat requests, unconstrained
and constrained by a JSON schema, alternating rounds on one `llmkern serve` (the embedded model
unless --model). Every request runs to max_tokens in both arms (ignore_eos, and a schema whose
array must be longer than max_tokens allows), so the arms decode the same number of tokens and
output tok/s compares like with like; the schema arm's outputs are checked to be a prefix of the
schema's language. Also the grammar's own cost: the per-step bitmask fill of 32 rows.

    python bench/bench_structured.py [--model M] [--rounds 2] [--concurrency 32] [--max-tokens 96]"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from typing import List, Optional

SCHEMA = {"type": "object", "required": ["notes"], "additionalProperties": False,
          "properties": {"notes": {"type": "array", "minItems": 200,
                                   "items": {"type": "string", "maxLength": 12}}}}


async def _arm(base: str, n: int, max_tokens: int, schema: Optional[dict]) -> dict:
    import httpx

    body = {"messages": [{"role": "user", "content": "Write notes about caches."}], "max_tokens": max_tokens,
            "temperature": 1.0, "ignore_eos": True}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "notes", "schema": schema}}
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*[c.post("/v1/chat/completions", json=dict(body, seed=i)) for i in range(n)])
        wall = time.perf_counter() - t0
    outs = [r.json() for r in rs]
    bad = [o for o in outs if "choices" not in o]
    if bad:
        raise RuntimeError(f"request failed: {bad[0]}")
    toks = sum(o["usage"]["completion_tokens"] for o in outs)
    if schema is not None:   # cut by max_tokens, each output is an unfinished document of the schema
        assert all(o["choices"][0]["message"]["content"].startswith('{"notes":') for o in outs), \
            [o["choices"][0]["message"]["content"] for o in outs]
    return {"tokens": toks, "wall_s": wall, "tok_s": toks / wall}


def fill_cost(rows: int = 32, steps: int = 64) -> float:
    """Microseconds per row per step of xgrammar's mask fill for SCHEMA on the default tokenizer."""
    from ..engine.structured import StructuredOutputs
    from ..engine.structured_params import StructuredOutputsParams
    from ..models.loader import load_tokenizer

    tok = load_tokenizer(None)
    so = StructuredOutputs(tok, tok.vocab_size, tok.eos_token_ids)
    compiled = so.compile(StructuredOutputsParams(json=SCHEMA))
    ms = [so.compiler.matcher(compiled) for _ in range(rows)]
    doc = tok.encode('{"notes": [' + ", ".join(['"cache line"'] * 40), add_special_tokens=False)[:steps]
    from ..engine.grammar import new_bitmask

    bm = new_bitmask(rows, so.compiler.words)
    t = 0.0
    for tid in doc:
        t0 = time.perf_counter()
        so.compiler.fill_rows(ms, bm, list(range(rows)))
        t += time.perf_counter() - t0
        for m in ms:
            m.accept(tid)
    return t / (len(doc) * rows) * 1e6


def main(argv: Optional[List[str]] = None) -> int:
    from ..procs import ServerProcess, llmkern_serve_argv

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args(argv)
    print(f"cpu: {platform.processor() or platform.machine()}; load average at start: "
          f"{open('/proc/loadavg').read().split()[:3]}")
    print(f"xgrammar mask fill: {fill_cost():.1f} us per row per step (32 rows)")
    srv = ServerProcess("llmkern", llmkern_serve_argv(["--max-num-seqs", str(a.concurrency)], a.model))
    try:
        asyncio.run(_arm(srv.base, 4, 8, None))        # warm-up: both paths once
        asyncio.run(_arm(srv.base, 4, 8, SCHEMA))
        rows = []
        for r in range(a.rounds):
            for name, schema in (("unconstrained", None), ("json_schema", SCHEMA)):
                res = asyncio.run(_arm(srv.base, a.concurrency, a.max_tokens, schema))
                rows.append(dict(res, arm=name, round=r))
                print(json.dumps(rows[-1]))
    finally:
        srv.close()
    free = sum(x["tok_s"] for x in rows if x["arm"] == "unconstrained")
    cons = sum(x["tok_s"] for x in rows if x["arm"] == "json_schema")
    print(f"json_schema / unconstrained output tok/s: {cons / free:.3f} (overhead {100 * (1 - cons / free):.1f}%); "
          f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
