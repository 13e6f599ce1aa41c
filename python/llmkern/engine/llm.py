"""LLM: the offline batch API.

    from llmkern import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    print(outs[0].text, outs[0].metrics.ttft)
"""
from __future__ import annotations

import time
from typing import List, Optional, Sequence, Union

from .config import EngineConfig
from .engine import Engine
from .processor import PromptType
from .outputs import (EmbeddingOutput, EmbeddingRequestOutput, RequestOutput, ScoringOutput,
                      ScoringRequestOutput)
from .param_checks import ParamError
from .sampling_params import SamplingParams


def _as_params(sp, name: str) -> SamplingParams:
    """A SamplingParams from None (the defaults), a SamplingParams or a dict of its fields; errors
    name the field under `name` (e.g. "sampling_params[1].temperature: expected ...")."""
    if sp is None:
        return SamplingParams()
    if not isinstance(sp, (SamplingParams, dict)):
        raise TypeError(f"{name}: expected a SamplingParams or a dict, got {type(sp).__name__}")
    try:
        if isinstance(sp, dict):
            return SamplingParams.from_dict(sp)
        sp.validate()        # again: its fields may have been changed since it was made
        return sp
    except ValueError as e:
        raise ParamError(f"{name}.{getattr(e, 'param', '')}".rstrip("."), str(e).partition(": ")[2]) from None


class LLM:
    def __init__(self, model=None, load_format: str = "auto", **kwargs):
        """model: None (embedded default), a HF model directory or a .gguf file (or, with
        load_format="dummy", a config for random weights). Other keywords: EngineConfig fields
        (max_num_seqs, max_num_batched_tokens, block_size, enable_prefix_caching, ...,
        tensor_parallel_size, pipeline_parallel_size, expert_parallel_size: the model split over
        that many processes;
        call shutdown() or use `with LLM(...) as llm:` to stop them before the interpreter exits)."""
        config, rest = EngineConfig.split_kwargs(kwargs)
        if rest:
            raise TypeError(f"LLM: unknown argument(s) {', '.join(sorted(rest))}")
        self.engine = Engine(model, config, load_format)
        self.tokenizer = self.engine.tokenizer

    @staticmethod
    def _as_list(prompts) -> List[PromptType]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
            return [list(prompts)]      # one prompt given as token ids
        if isinstance(prompts, (list, tuple)) and prompts and all(
                isinstance(m, dict) and "role" in m for m in prompts):
            return [list(prompts)]      # one chat
        return list(prompts)

    def generate(self, prompts, sampling_params: Union[None, SamplingParams, dict,
                                                      Sequence[Union[SamplingParams, dict]]] = None,
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Run all prompts to completion; one RequestOutput per prompt, in order. A bad prompt
        gets an output with `.error` set (and no completions); the others run normally.
        sampling_params: one for all prompts or one per prompt, each a SamplingParams or a dict of
        its fields; all are checked before any prompt is admitted (a bad one raises, naming its index)."""
        plist = self._as_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(plist):
                raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(plist)} prompts")
            sps = [_as_params(sp, f"sampling_params[{i}]") for i, sp in enumerate(sampling_params)]
        else:
            sps = [_as_params(sampling_params, "sampling_params")] * len(plist)
        eng = self.engine
        results: List[Optional[RequestOutput]] = [None] * len(plist)
        index = {}
        for i, (p, sp) in enumerate(zip(plist, sps)):
            try:
                rid = eng.add_request(p, sp)
                index[rid] = i
            except (ValueError, TypeError) as e:
                results[i] = RequestOutput(request_id="", prompt=p if isinstance(p, str) else None,
                                           prompt_token_ids=[], outputs=[], finished=True, error=str(e))
        bar = None
        if use_tqdm and index:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(index), desc="generate", unit="req", dynamic_ncols=True)
        out_toks, t0 = 0, time.perf_counter()
        try:
            while index and any(results[i] is None for i in index.values()):
                for out in eng.step():
                    i = index.get(out.request_id)
                    if i is None or not out.finished:
                        continue
                    results[i] = out
                    if bar is not None:
                        out_toks += sum(len(c.token_ids) for c in out.outputs)
                        bar.set_postfix_str(f"{out_toks / (time.perf_counter() - t0):.1f} out tok/s")
                        bar.update(1)
        except BaseException:
            for rid in index:   # leave the engine clean for the next call
                eng.abort(rid)
            eng._collect([])
            raise
        finally:
            if bar is not None:
                bar.close()
        return results

    def chat(self, messages, sampling_params: Optional[SamplingParams] = None, use_tqdm: bool = False):
        """One chat (list of {"role", "content"}) or a list of chats, with the model's template."""
        chats = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        return self.generate([list(c) for c in chats], sampling_params, use_tqdm)

    # -- prefill-only tasks ------------------------------------------------------------------------
    def _token_lists(self, prompts, what: str) -> List[List[int]]:
        out = []
        for i, p in enumerate(self._as_list(prompts)):
            try:
                out.append(self.engine.tokenize(p)[1])
            except (ValueError, TypeError) as e:
                raise type(e)(f"{what}[{i}]: {e}") from None
        return out

    def embed(self, prompts, pooling: str = "mean", normalize: bool = True) -> List[EmbeddingRequestOutput]:
        """One embedding per prompt (str, token-id list or {"prompt_token_ids": [...]}), in order:
        the final hidden states (after the last norm) pooled by "mean" over the tokens, the "last"
        token or the first ("cls") token, L2-normalised unless normalize=False. Runs prefill only,
        batched under max_num_batched_tokens; no KV blocks are used."""
        from .prefill_tasks import embed

        ids = self._token_lists(prompts, "prompts")
        vecs = embed(self.engine, ids, pooling, normalize)
        return [EmbeddingRequestOutput(str(i), EmbeddingOutput(v.tolist()), t)
                for i, (v, t) in enumerate(zip(vecs, ids))]

    def score(self, prompts, continuations) -> List[ScoringRequestOutput]:
        """Log-likelihood of each continuation given its prompt (pairs in order; strings or token
        ids). A string continuation is tokenised without special tokens and appended to the prompt's
        tokens. Unlike vLLM's score (similarity of two texts under a cross-encoder or embedding
        model), this scores text under the language model: `.outputs.score` is the summed log-prob."""
        from .prefill_tasks import loglikelihood

        ps = self._token_lists(prompts, "prompts")
        conts = self._as_list(continuations)
        if len(conts) != len(ps):
            raise ValueError(f"continuations: {len(conts)} given for {len(ps)} prompts")
        cs = []
        for i, c in enumerate(conts):
            if isinstance(c, str):
                self.engine._need_tokenizer()
                cs.append(self.tokenizer.encode(c, add_special_tokens=False))
            else:
                try:
                    cs.append(self.engine.tokenize(c)[1])
                except (ValueError, TypeError) as e:
                    raise type(e)(f"continuations[{i}]: {e}") from None
        res = loglikelihood(self.engine, ps, cs)
        return [ScoringRequestOutput(str(i), ScoringOutput(float(sum(lp)), lp, g), p, c)
                for i, ((lp, g), p, c) in enumerate(zip(res, ps, cs))]

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block not in use (e.g. between benchmark runs)."""
        self.engine.kv.reset_prefix_cache()

    def run_metrics(self) -> dict:
        return self.engine.run_metrics()

    def shutdown(self) -> None:
        """Stop the worker processes of a model-parallel engine (tensor/pipeline_parallel_size > 1)."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
