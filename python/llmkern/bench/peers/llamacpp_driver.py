"""Peer driver: llama.cpp through llama-cpp-python, run by the bench under that venv's python.

The bench hands it a GGUF of the same weights (F32, or BF16 matrices with F32 norms) in
options["gguf"]. llama-cpp-python's high-level Llama object decodes one sequence at a time, so
requests run one after another: this peer is measured on batch-1 decode. Greedy (temp 0), EOS
not consulted (the loop runs to the requested length). Protocol: driver_io.py."""
from __future__ import annotations

import sys

from driver_io import serve


def init(msg):
    import llama_cpp

    opts = dict(msg.get("options") or {})
    threads = int(msg.get("threads") or 1)
    llm = llama_cpp.Llama(model_path=opts["gguf"], n_ctx=int(opts.get("n_ctx", 1024)), n_threads=threads,
                          n_threads_batch=threads, n_batch=int(opts.get("n_batch", 512)), seed=0, verbose=False)
    return llm, {"peer": "llama.cpp", "version": llama_cpp.__version__,
                 "config": f"n_threads={threads} n_batch={opts.get('n_batch', 512)} {opts['gguf'].rsplit('/', 1)[-1]}"}


def generate(llm, prompts, max_tokens):
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
