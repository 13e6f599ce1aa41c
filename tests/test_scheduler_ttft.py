"""The scheduler's choices for first tokens: bounded decode deferral (decode_defer_steps) and short
prompts beside a long prompt's chunks (short_prompt_share). Each changes only the order of work:
outputs are those of the plain schedule and no KV block is leaked."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern.engine.config import EngineConfig  # noqa: E402
from llmkern.engine.engine import Engine
from llmkern.engine.sampling_params import SamplingParams


def _engine(**kw):
    """An engine whose schedule() records each step's (prefill request ids, decode request ids)."""
    from serve_helpers import require_default_model

    require_default_model()
    eng = Engine(config=EngineConfig(kv_cache_memory_gb=0.05, **kw))
    plan, orig = [], eng.scheduler.schedule

    def schedule(*a, **k):
        b = orig(*a, **k)
        plan.append(([s.request.request_id for s in b.prefills], [s.request.request_id for s in b.decodes]))
        return b

    eng.scheduler.schedule = schedule
    return eng, plan


def _finish(eng, out):
    while eng.scheduler.has_work:
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return out


def _run(defer: int):
    """Request A decodes; B then C arrive one step apart. Returns (each step's (prefill request ids,
    decode request ids)), greedy token ids per request, blocks in use at the end."""
    eng, plan = _engine(decode_defer_steps=defer)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    out = {}
    eng.add_request([11, 12, 13, 14, 15], sp, request_id="A")
    for arrive in ("B", "C", None, None, None, None, None, None, None, None, None):
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
        if arrive:
            eng.add_request([21, 22, 23, 24, 25, 26, 27][:5 if arrive == "B" else 7], sp, request_id=arrive)
    return plan, _finish(eng, out), eng.kv.pool.num_used


def test_deferral_is_bounded_and_changes_no_output():
    plan0, out0, used0 = _run(0)
    plan1, out1, used1 = _run(1)
    assert out1 == out0 and set(out1) == {"A", "B", "C"} and used1 == used0 == 0
    # mixed: B's prefill step carries A's decode
    assert plan0[1] == (["B"], ["A"])
    # deferred once: B alone, then C alone would be a second deferral in a row, so A and B decode with it
    assert plan1[1] == (["B"], [])
    assert plan1[2] == (["C"], ["A", "B"])


def test_config_and_serve_flag():
    from llmkern.serve.command_args import serve_engine_kwargs, serve_parser

    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="decode_defer_steps"):
            EngineConfig(decode_defer_steps=bad)
    assert serve_engine_kwargs(serve_parser().parse_args(["--decode-defer-steps", "2"]))["decode_defer_steps"] == 2
    assert serve_engine_kwargs(serve_parser().parse_args([]))["decode_defer_steps"] == 1
    cpu = serve_engine_kwargs(serve_parser().parse_args(["--device", "cpu"]))
    assert cpu["max_num_batched_tokens"] == 1024
    assert serve_engine_kwargs(serve_parser().parse_args(["--device", "cpu", "--max-num-batched-tokens", "2048"]))[
        "max_num_batched_tokens"] == 2048


def _long_then_short(share: float):
    """A 200-token prompt (budget 64 a step, so in chunks), then a 10-token one after its first chunk."""
    eng, plan = _engine(max_num_batched_tokens=64, short_prompt_share=share)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng.add_request([100 + i for i in range(200)], sp, request_id="long")
    out = {o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished}
    eng.add_request([300 + i for i in range(10)], sp, request_id="short")
    return plan, _finish(eng, out), eng.kv.pool.num_used


def test_short_prompt_joins_a_long_prompts_chunks():
    plan0, out0, used0 = _long_then_short(0.0)
    plan5, out5, used5 = _long_then_short(0.5)
    assert out5 == out0 and set(out0) == {"long", "short"} and used5 == used0 == 0
    # strict arrival order: the short prompt waits for every chunk of the long one
    assert [p for p, _ in plan0[:4]] == [["long"], ["long"], ["long"], ["long", "short"]]
    # with the share: it is prefilled in the very next step, beside the long prompt's chunk
    assert plan5[1] == (["long", "short"], [])
    with pytest.raises(ValueError, match="short_prompt_share"):
        EngineConfig(short_prompt_share=1.5)
