"""Work that needs only a prefill: embeddings (pooled final hidden states) and log-likelihoods of
given continuations. Sequences go through the model runner's prefill-only pass in batches packed
under the token budget (no padding, no KV blocks, no decode state)."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .pooling import pool


def token_batches(lengths: Sequence[int], budget: int) -> List[List[int]]:
    """Indices in order, packed greedily into batches of at most `budget` tokens (a longer sequence
    runs alone)."""
    out, cur, n = [], [], 0
    for i, L in enumerate(lengths):
        if cur and n + L > budget:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += L
    if cur:
        out.append(cur)
    return out


def check_lengths(engine, token_lists: Sequence[List[int]], what: str) -> None:
    if not hasattr(engine.runner, "run_prompts"):
        raise NotImplementedError("embed/score: not available with tensor or pipeline parallelism "
                                  "(run one engine per process, e.g. with --ray)")
    for i, t in enumerate(token_lists):
        if not t:
            raise ValueError(f"{what}[{i}]: is empty (0 tokens)")
        if len(t) > engine.max_model_len:
            raise ValueError(f"{what}[{i}]: {len(t)} tokens, but the model allows at most {engine.max_model_len}")


@torch.inference_mode()
def embed(engine, token_lists: Sequence[List[int]], pooling: str, normalize: bool) -> torch.Tensor:
    """fp32 [len(token_lists), hidden] pooled embeddings."""
    check_lengths(engine, token_lists, "prompts")
    budget = engine.config.max_num_batched_tokens
    hidden_size = engine.model_config.hidden_size
    out = torch.empty((len(token_lists), hidden_size), dtype=torch.float32)
    for idx in token_batches([len(t) for t in token_lists], budget):
        hidden, cu = engine.runner.run_prompts([token_lists[i] for i in idx])
        out[idx] = pool(hidden, cu, pooling, normalize).cpu()
    return out


@torch.inference_mode()
def loglikelihood(engine, prompts: Sequence[List[int]], continuations: Sequence[List[int]]
                  ) -> List[Tuple[List[float], bool]]:
    """Per pair: (log p of each continuation token given all before it, whether each was the argmax)."""
    for i, c in enumerate(continuations):
        if not c:
            raise ValueError(f"continuations[{i}]: is empty (0 tokens)")
    full = [list(p) + list(c) for p, c in zip(prompts, continuations)]
    check_lengths(engine, prompts, "prompts")
    check_lengths(engine, full, "prompts + continuations")
    budget = engine.config.max_num_batched_tokens
    res: List[Tuple[List[float], bool]] = [([], False)] * len(full)
    for idx in token_batches([len(t) for t in full], budget):
        hidden, cu = engine.runner.run_prompts([full[i] for i in idx])
        rows, targets = [], []
        for j, i in enumerate(idx):  # the row before each continuation token predicts it
            start = int(cu[j]) + len(prompts[i]) - 1
            rows.extend(range(start, start + len(continuations[i])))
            targets.extend(continuations[i])
        logits = engine.model.compute_logits(hidden, torch.tensor(rows, device=hidden.device))
        logp = torch.log_softmax(logits, dim=-1)
        tgt = torch.tensor(targets, device=logp.device)
        lp = logp.gather(1, tgt[:, None])[:, 0].cpu().tolist()
        greedy = (logits.argmax(dim=-1) == tgt).cpu().tolist()
        k = 0
        for i in idx:
            n = len(continuations[i])
            res[i] = (lp[k:k + n], all(greedy[k:k + n]))
            k += n
    return res


@torch.inference_mode()
def prompt_logprobs(engine, ids: List[int], k: int, rows_per_chunk: int = 256) -> list:
    """OpenAI's echo logprobs of one prompt: None for the first token, then per token (its logprob
    given the tokens before it, the k most likely [(id, logprob)]). Logits are taken a chunk of rows
    at a time, so a long prompt never holds [len, vocab] at once."""
    check_lengths(engine, [ids], "prompt")
    hidden, _ = engine.runner.run_prompts([list(ids)])
    out: list = [None]
    for lo in range(0, len(ids) - 1, rows_per_chunk):
        hi = min(len(ids) - 1, lo + rows_per_chunk)
        logits = engine.model.compute_logits(hidden, torch.arange(lo, hi, device=hidden.device))
        logp = torch.log_softmax(logits.float(), dim=-1)
        tgt = torch.tensor(ids[lo + 1:hi + 1], device=logp.device)
        chosen = logp.gather(1, tgt[:, None])[:, 0].tolist()
        top_v, top_i = logp.topk(k, dim=-1) if k else (None, None)
        for r, lp in enumerate(chosen):
            out.append((lp, list(zip(top_i[r].tolist(), top_v[r].tolist())) if k else []))
    return out
