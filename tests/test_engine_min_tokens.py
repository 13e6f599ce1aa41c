"""min_tokens holds back every EOS id and stop_token_id until it is reached, with or without
ignore_eos, on the plain and the speculative path: greedy tokens equal HF transformers'
generate(min_new_tokens=...) on ChatML-shaped prompts of a tiny random Llama whose LM head makes
EOS the greedy choice everywhere."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams
from runtime_helpers import tiny_hf_model

EOS = 2      # <|im_end|>, as in SmolLM2's ChatML: it also closes each turn inside the prompt
MIN = 20
STOP = 83    # a token the model picks often once EOS is banned


def chat(user):
    # <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
    return [1, 30, 31, 10, 40, 41, 42, EOS, 10, 1, 50, 10] + user + [EOS, 10, 1, 60, 10]


PROMPTS = [chat([100, 101, 102]), chat([120, 7, 77, 200, 201]), chat([3, 4, 5, 6])]


@pytest.fixture(scope="module")
def eos_prone(tmp_path_factory):
    hf = tiny_hf_model(str(tmp_path_factory.mktemp("base")), "llama")
    with torch.no_grad():
        # EOS's head row along the mean final hidden state of the prompts: EOS wins every step.
        h = torch.cat([hf.model(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]).mean(0)
        w = hf.lm_head.weight
        w[EOS] = h / h.norm() * w.norm(dim=1).mean() * 2
    path = str(tmp_path_factory.mktemp("eos_prone"))
    hf.save_pretrained(path)
    return path, hf


@torch.inference_mode()
def hf_generate(model, prompt, **kw):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


ENGINES = {
    "plain": dict(),
    "spec-early-exit": dict(speculative={"method": "early_exit", "num_speculative_tokens": 3, "num_layers": 1}),
    "spec-ngram": dict(speculative="ngram:4"),
}


def test_the_model_emits_eos_at_once_without_min_tokens(eos_prone):
    # Without this the tests below could not fail.
    _, hf = eos_prone
    assert all(hf_generate(hf, p, max_new_tokens=4) == [EOS] for p in PROMPTS)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_min_tokens_matches_hf_min_new_tokens(eos_prone, engine):
    path, hf = eos_prone
    llm = LLM(path, num_gpu_blocks=64, **ENGINES[engine])

    # ignore_eos: EOS is still banned below min_tokens (the reported bug emitted it at once).
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, min_tokens=MIN, max_tokens=MIN, ignore_eos=True),
                        use_tqdm=False)
    ref = [hf_generate(hf, p, min_new_tokens=MIN, max_new_tokens=MIN) for p in PROMPTS]
    assert [o.token_ids for o in outs] == ref
    assert all(EOS not in r for r in ref)

    # Without ignore_eos: EOS comes as soon as it is allowed, and stops the request.
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, min_tokens=MIN, max_tokens=MIN + 5), use_tqdm=False)
    ref = [hf_generate(hf, p, min_new_tokens=MIN, max_new_tokens=MIN + 5) for p in PROMPTS]
    assert [o.token_ids for o in outs] == ref
    assert all(r[-1] == EOS and len(r) == MIN + 1 for r in ref)
    assert all(o.finish_reason == "stop" for o in outs)

    # stop_token_ids are held back too (HF: every id of eos_token_id).
    sp = SamplingParams(temperature=0, min_tokens=MIN, max_tokens=MIN, ignore_eos=True, stop_token_ids=[STOP])
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    ref = [hf_generate(hf, p, min_new_tokens=MIN, max_new_tokens=MIN, eos_token_id=[EOS, STOP]) for p in PROMPTS]
    assert [o.token_ids for o in outs] == ref
    free = [hf_generate(hf, p, min_new_tokens=MIN, max_new_tokens=MIN) for p in PROMPTS]
    assert any(STOP in f for f in free)  # the stop id would have been chosen without the mask

    pool = llm.engine.kv.pool
    assert pool.num_used == 0, "blocks leaked"
