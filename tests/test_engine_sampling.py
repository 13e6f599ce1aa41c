"""Sampled generation through the engine follows the model's distribution: first tokens of many
samples vs HF's softmax on the same weights (chi-square test, goodness_of_fit.py), and top-k /
top-p / min-p keep the draws inside the filtered support."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import LLM, SamplingParams
from goodness_of_fit import assert_follows, follows
from runtime_helpers import tiny_hf_model

PROMPT = [5, 17, 33, 2, 90]
N = 3000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny-sampling"))
    hf = tiny_hf_model(path, "llama", seed=3, initializer_range=0.5)
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT])).logits[0, -1].float()
    return LLM(path, num_gpu_blocks=64, max_num_seqs=512), logits


def first_tokens(llm, sp):
    out = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    return torch.tensor([c.token_ids[0] for c in out.outputs])


def test_temperature_sampling_matches_softmax(tiny):
    llm, logits = tiny
    for temp in (1.0, 0.7):
        p = torch.softmax(logits.double() / temp, -1)
        toks = first_tokens(llm, SamplingParams(n=N, temperature=temp, max_tokens=1, ignore_eos=True))
        assert_follows(toks, p)
        # the test has the power to see a slightly wrong temperature
        assert not follows(toks, torch.softmax(logits.double() / (temp - 0.1), -1)), temp


def test_filters_keep_support(tiny):
    llm, logits = tiny
    p = torch.softmax(logits, -1)
    order = torch.argsort(p, descending=True)
    toks = set(first_tokens(llm, SamplingParams(n=500, top_k=5, max_tokens=1, ignore_eos=True)).tolist())
    assert toks <= set(order[:5].tolist()) and len(toks) > 1
    cum = torch.cumsum(p[order], 0)
    k = int((cum < 0.3).sum()) + 1
    toks = set(first_tokens(llm, SamplingParams(n=500, top_p=0.3, max_tokens=1, ignore_eos=True)).tolist())
    assert toks <= set(order[:k].tolist())
    keep = set(torch.nonzero(p >= 0.5 * p.max()).flatten().tolist())
    toks = set(first_tokens(llm, SamplingParams(n=500, min_p=0.5, max_tokens=1, ignore_eos=True)).tolist())
    assert toks <= keep
