"""lm-eval-harness, unmodified, against `llmkern serve`: its `local-completions` model (echo with
prompt logprobs, and the server's /tokenizer_info + /tokenize as its remote tokenizer) on a small
multiple-choice task written here (no hub access) scores exactly what lm-eval's own `hf` model
scores on the same GGUF file (loaded by transformers' GGUF reader), and every per-choice
log-likelihood agrees."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
lm_eval = pytest.importorskip("lm_eval")

from llmkern.models.loader import DEFAULT_MODEL_NAME  # noqa: E402
from serve_helpers import ServerProcess, require_default_model  # noqa: E402

pytestmark = pytest.mark.slow

QUESTIONS = [
    ("What is the capital of France?", ["Paris", "Berlin", "Madrid", "Rome"], 0),
    ("How many legs does a spider have?", ["six", "eight", "ten", "four"], 1),
    ("Which planet is known as the red planet?", ["Venus", "Jupiter", "Mars", "Saturn"], 2),
    ("What do bees make?", ["milk", "silk", "wax paper", "honey"], 3),
    ("What is frozen water called?", ["ice", "steam", "sand", "glass"], 0),
    ("Which animal barks?", ["cat", "dog", "cow", "fish"], 1),
    ("What color is the sky on a clear day?", ["green", "red", "blue", "black"], 2),
    ("How many days are in a week?", ["five", "six", "ten", "seven"], 3),
    ("Who wrote Romeo and Juliet?", ["William Shakespeare", "Charles Dickens", "Mark Twain", "Jane Austen"], 0),
    ("What is 2 plus 2?", ["three", "four", "five", "six"], 1),
    ("Which gas do plants take in?", ["oxygen", "helium", "carbon dioxide", "hydrogen"], 2),
    ("What is the largest ocean?", ["Atlantic", "Indian", "Arctic", "Pacific"], 3),
]

TASK_YAML = """task: llmkern_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def _evaluate(model: str, model_args: str, tasks_dir: str):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model=model, model_args=model_args, tasks=["llmkern_mc"], batch_size=4,
                          task_manager=TaskManager(include_path=tasks_dir), log_samples=True)
    res = out["results"]["llmkern_mc"]
    lls = [[r[0][0] for r in s["resps"]] for s in sorted(out["samples"]["llmkern_mc"], key=lambda s: s["doc_id"])]
    return res["acc,none"], res["acc_norm,none"], lls


def test_local_completions_scores_as_hf_does(tmp_path):
    gguf = require_default_model()
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    (tmp_path / "llmkern_mc.yaml").write_text(TASK_YAML.format(data=data))
    # HF's loglikelihoods to 0.002: the weights dequantised as HF holds them
    with ServerProcess(["--max-model-len", "512", "--kv-cache-memory-gb", "0.25", "--quantization", "none"],
                       startup_timeout=300) as s:
        ours = _evaluate("local-completions", f"model={DEFAULT_MODEL_NAME},base_url={s.base}/v1/completions,"
                                              "num_concurrent=2,max_retries=1,tokenized_requests=True",
                         str(tmp_path))
    hf = _evaluate("hf", f"pretrained={os.path.dirname(gguf)},gguf_file={os.path.basename(gguf)},dtype=float32,device=cpu",
                   str(tmp_path))
    assert ours[0] == hf[0] and ours[1] == hf[1], (ours[:2], hf[:2])
    assert ours[0] >= 0.5   # the task is easy: a broken echo/logprob path scores at chance (0.25)
    for a, b in zip(ours[2], hf[2]):
        assert a == pytest.approx(b, abs=2e-3)
