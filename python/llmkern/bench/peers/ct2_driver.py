"""Peer driver: CTranslate2 (`pip install ctranslate2 transformers torch`), run by the bench under
that venv's python.

On first use the HF model directory is converted (ctranslate2's transformers converter, weights
kept in float32) into options["ct2_dir"], a cache the bench keeps outside the repository. Prompts
arrive as token ids and are mapped to the converted model's vocabulary strings; greedy
(sampling_topk=1), min_length = max_length = the request's output length so EOS cannot end it
early. One generate_batch call takes one output length, so requests are sorted by length and cut
into batches of options["max_batch"] (each runs to its longest member; the extra tokens are
computed, then dropped), all submitted asynchronously so inter_threads > 1 runs batches side by
side. Protocol: driver_io.py."""
from __future__ import annotations

import json
import os
import shutil
import sys

from driver_io import serve


def _convert(model_dir: str, out_dir: str) -> None:
    from ctranslate2.converters import TransformersConverter

    tmp = out_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    TransformersConverter(model_dir).convert(tmp, quantization="float32", force=True)
    os.replace(tmp, out_dir)  # a half-written conversion is never mistaken for a finished one


def _vocabulary(ct2_dir: str) -> list:
    path = os.path.join(ct2_dir, "vocabulary.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    with open(os.path.join(ct2_dir, "vocabulary.txt")) as f:
        return [line.rstrip("\n") for line in f]


def init(msg):
    import ctranslate2

    opts = dict(msg.get("options") or {})
    ct2_dir = opts["ct2_dir"]
    if not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        _convert(msg["model_dir"], ct2_dir)
    compute_type = msg["dtype"]
    supported = ctranslate2.get_supported_compute_types("cpu")
    if compute_type not in supported:
        raise ValueError(f"dtype: CTranslate2 {ctranslate2.__version__} on this CPU supports "
                         f"{sorted(supported)}, not {compute_type}")
    threads = int(msg.get("threads") or os.cpu_count() or 1)
    inter = int(opts.get("inter_threads", 1))
    intra = int(opts.get("intra_threads", max(1, threads // inter)))
    gen = ctranslate2.Generator(ct2_dir, device="cpu", compute_type=compute_type,
                                inter_threads=inter, intra_threads=intra)
    state = {"gen": gen, "vocab": _vocabulary(ct2_dir), "max_batch": int(opts.get("max_batch", 32))}
    info = {"peer": "ctranslate2", "version": ctranslate2.__version__,
            "config": f"compute_type={compute_type} inter_threads={inter} intra_threads={intra} "
                      f"max_batch={state['max_batch']}"}
    return state, info


def generate(state, prompts, max_tokens):
    vocab, gen, size = state["vocab"], state["gen"], max(1, state["max_batch"])
    order = sorted(range(len(prompts)), key=lambda i: -max_tokens[i])
    pending = []
    for start in range(0, len(order), size):
        idx = order[start:start + size]
        n = max(max_tokens[i] for i in idx)
        toks = [[vocab[t] for t in prompts[i]] for i in idx]
        res = gen.generate_batch(toks, max_length=n, min_length=n, sampling_topk=1, beam_size=1,
                                 include_prompt_in_result=False, asynchronous=True)
        pending.append((idx, res))
    out = [None] * len(prompts)
    for idx, res in pending:
        for i, r in zip(idx, res):
            out[i] = list(r.result().sequences_ids[0])[:max_tokens[i]]
    return out


if __name__ == "__main__":
    sys.exit(serve(init, generate))
