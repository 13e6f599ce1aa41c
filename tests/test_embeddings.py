"""LLM.embed and LLM.score against HF transformers' hidden states / logits on the same tiny random
weights; the prefill-only pass uses no KV block; `llmkern embed` writes the same vectors."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import LLM, cli
from runtime_helpers import tiny_hf_model

LENGTHS = [1, 5, 17, 40, 3, 70, 9]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("emb") / "m")
    hf = tiny_hf_model(path, "qwen2", tie_word_embeddings=True)
    g = torch.Generator().manual_seed(1)
    texts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in LENGTHS]
    with torch.no_grad():
        hidden = [hf.model(torch.tensor([t])).last_hidden_state[0] for t in texts]
    # A budget of 32 tokens packs several sequences per pass and runs the 40- and 70-token ones alone.
    llm = LLM(path, max_num_batched_tokens=32, num_gpu_blocks=8)
    return path, hf, texts, hidden, llm


def _ref(h: torch.Tensor, pooling: str, normalize: bool) -> torch.Tensor:
    v = {"mean": h.mean(0), "last": h[-1], "cls": h[0]}[pooling]
    return torch.nn.functional.normalize(v, dim=0) if normalize else v


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
@pytest.mark.parametrize("normalize", [True, False])
def test_embed_matches_hf(tiny, pooling, normalize):
    _, _, texts, hidden, llm = tiny
    outs = llm.embed([{"prompt_token_ids": t} for t in texts], pooling=pooling, normalize=normalize)
    assert len(outs) == len(texts)
    for o, t, h in zip(outs, texts, hidden):
        assert o.prompt_token_ids == t
        ref = _ref(h, pooling, normalize)
        got = torch.tensor(o.outputs.embedding)
        assert torch.allclose(got, ref, atol=2e-5, rtol=1e-4), (got - ref).abs().max()
    kv = llm.engine.kv
    assert kv.pool.num_used == 0 and all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert all(not c.any() for pair in kv.caches for c in pair), "the prefill-only pass wrote the KV cache"


def test_score_matches_hf_log_softmax(tiny):
    _, hf, texts, _, llm = tiny
    prompts, conts = texts[1:5], [texts[0] + [7], [11, 12, 13], texts[4], [200] * 4]
    outs = llm.score([{"prompt_token_ids": p} for p in prompts], [{"prompt_token_ids": c} for c in conts])
    for o, p, c in zip(outs, prompts, conts):
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([p + c])).logits[0].double(), -1)
        ref = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(c)]
        assert o.outputs.token_logprobs == pytest.approx(ref, abs=2e-4)
        assert o.outputs.score == pytest.approx(sum(ref), abs=1e-3)
        greedy = all(lp[len(p) - 1 + i].argmax().item() == t for i, t in enumerate(c))
        assert o.outputs.is_greedy == greedy


def test_bad_arguments_name_the_argument(tiny):
    _, _, texts, _, llm = tiny
    with pytest.raises(ValueError, match="pooling"):
        llm.embed([texts[0]], pooling="max")
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        llm.embed([texts[0], []])
    with pytest.raises(ValueError, match=r"prompts\[0\]: .*300 tokens"):
        llm.embed([[5] * 300])
    with pytest.raises(ValueError, match="continuations"):
        llm.score([texts[1]], [texts[2], texts[3]])
    with pytest.raises(ValueError, match=r"continuations\[0\]"):
        llm.score([texts[1]], [[]])


def test_embed_command_writes_hf_vectors(tiny, tmp_path):
    path, _, texts, hidden, _ = tiny
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [json.dumps({"id": f"t{i}", "prompt_token_ids": t}) for i, t in enumerate(texts)]
    lines.insert(2, json.dumps({"id": "bad", "input": ""}))
    inp.write_text("\n".join(lines) + "\n")
    rc = cli.main(["embed", "--model", path, "--input", str(inp), "--output", str(out), "--pooling", "last", "-q",
                   "--max-num-batched-tokens", "32", "--kv-cache-memory-gb", "0.001"])
    assert rc == 1   # the empty input is reported, the rest embedded
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in recs] == list(range(1, len(texts) + 2))
    assert "error" in recs[2] and recs[2]["id"] == "bad"
    good = recs[:2] + recs[3:]
    for r, t, h in zip(good, texts, hidden):
        assert r["metrics"]["prompt_tokens"] == len(t)
        assert torch.allclose(torch.tensor(r["embedding"]), _ref(h, "last", True), atol=2e-5)
