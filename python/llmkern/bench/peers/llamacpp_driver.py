"""Peer driver: llama.cpp through llama-cpp-python, run by the bench under that venv's python.

The bench hands it a GGUF in options["gguf"]: the same weights as F32, or BF16 matrices with F32
norms, or the default model's file as stored (Q4_1). One prompt: the high-level Llama object
(batch-1 decode). Several: llama.cpp's own batched decoding through the low-level API (as its
`batched` example): one context holding every sequence (n_seq_max, a KV stream each), the
prompts prefilled in batches of n_batch tokens, then one batch per step with a token of every
sequence. Greedy (argmax of the logits), EOS not consulted (each output runs to its requested
length). Flash attention on, its faster setting on the CPU (offline-32 ran 16-30% faster than with
it off on a Zen 4, batch-1 no slower; option flash_attn=0 turns it off); the KV cache in f16, its
default. Protocol: driver_io.py."""
from __future__ import annotations

import sys

from driver_io import serve


def init(msg):
    import llama_cpp

    opts = dict(msg.get("options") or {})
    threads = int(msg.get("threads") or 1)
    n_batch = int(opts.get("n_batch", 512))
    flash = bool(int(opts.get("flash_attn", 1)))  # its best setting: see the docstring
    llm = llama_cpp.Llama(model_path=opts["gguf"], n_ctx=int(opts.get("n_ctx", 1024)), n_threads=threads,
                          n_threads_batch=threads, n_batch=n_batch, flash_attn=flash, seed=0, verbose=False)
    llm._bench = {"threads": threads, "n_batch": n_batch}
    config = f"n_threads={threads} n_batch={n_batch} flash_attn={int(flash)} {opts['gguf'].rsplit('/', 1)[-1]}"
    return llm, {"peer": "llama.cpp", "version": llama_cpp.__version__, "config": config}


def _generate_batched(llm, prompts, max_tokens):
    import llama_cpp as L
    import numpy as np

    n, vocab = len(prompts), llm.n_vocab()
    cfg = llm._bench
    cp = llm.context_params  # the batch-1 context's settings (flash attention off, RoPE as read), resized
    p = type(cp).from_buffer_copy(cp)
    # a KV stream per sequence (not one unified cache, whose every token would attend over the
    # whole batch's cache behind a mask): n_ctx / n_seq_max cells each
    p.n_ctx = n * (max(len(q) + m for q, m in zip(prompts, max_tokens)) + 16)
    p.n_batch = p.n_ubatch = cfg["n_batch"]
    p.n_seq_max, p.kv_unified = n, False
    p.n_threads = p.n_threads_batch = cfg["threads"]
    ctx = L.llama_init_from_model(llm.model, p)
    if not ctx:
        raise RuntimeError("llama.cpp: no context for the batch")
    batch = L.llama_batch_init(max(cfg["n_batch"], n), 0, 1)
    try:
        def run(items):  # items: (token, position, sequence, wants logits); returns {sequence: argmax}
            picks = {}
            for lo in range(0, len(items), cfg["n_batch"]):
                chunk = items[lo:lo + cfg["n_batch"]]
                batch.n_tokens = len(chunk)
                for i, (tok, pos, seq, want) in enumerate(chunk):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                    batch.seq_id[i][0], batch.logits[i] = seq, want
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama.cpp: llama_decode failed")
                for i, (_, _, seq, want) in enumerate(chunk):
                    if want:
                        picks[seq] = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), (vocab,)).argmax())
            return picks

        items = [(t, j, s, j == len(q) - 1) for s, q in enumerate(prompts) for j, t in enumerate(q)]
        out = [[] for _ in prompts]
        for s, t in run(items).items():
            out[s].append(t)
        while True:
            live = [s for s in range(n) if len(out[s]) < max_tokens[s]]
            if not live:
                return out
            picks = run([(out[s][-1], len(prompts[s]) + len(out[s]) - 1, s, True) for s in live])
            for s in live:
                out[s].append(picks[s])
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)


def generate(llm, prompts, max_tokens):
    if len(prompts) > 1:
        return _generate_batched(llm, prompts, max_tokens)
    out = []
    for prompt, n in zip(prompts, max_tokens):
        llm.reset()
        llm.eval(list(prompt))
        toks = []
        while True:
            toks.append(int(llm.sample(temp=0.0)))
            if len(toks) == n:
                break
            llm.eval([toks[-1]])
        out.append(toks)
    return out


if __name__ == "__main__":
    sys.exit(serve(init, generate))
