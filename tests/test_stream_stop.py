"""Streaming never shows text past a stop string, including one that spans two tokens (the
characters that could still begin a stop are held back until the next token decides), and the
inter-token latencies of speculative steps are spread over the tokens they commit, not 0 ms."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, SamplingParams
from llmkern.engine.detokenizer import stop_holdback
from llmkern.engine.metrics import format_summary, inter_token_latencies

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def two_char_model(tmp_path) -> str:
    """A tiny random model whose tokenizer maps each id to a two-letter string (decoded by
    concatenation), so stop strings can be placed across token boundaries."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {chr(97 + i % 26) + chr(97 + (i // 26) % 26): i for i in range(TINY["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="aa"))
    tok.decoder = decoders.Fuse()
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    tok.save(str(d / "tokenizer.json"))
    return str(d)


def stream(llm, prompt, sp):
    eng = llm.engine
    rid = eng.add_request(prompt, sp, stream=True)
    deltas, final = [], None
    while eng.has_unfinished_requests():
        for out in eng.step():
            assert out.request_id == rid
            c = out.outputs[0]
            deltas.append(c.delta_text)
            assert c.text == "".join(deltas)  # the visible text is exactly what was streamed
            if out.finished:
                final = out
    return deltas, final


def test_stream_holds_back_a_stop_spanning_two_tokens(tmp_path):
    llm = LLM(two_char_model(tmp_path), load_format="dummy", num_gpu_blocks=32, block_size=4)
    prompt = [5, 30, 61, 9]
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    pieces = [llm.tokenizer.decode([t]) for t in free.token_ids]
    assert "".join(pieces) == free.text and all(len(p) == 2 for p in pieces)
    checked = 0
    for cut in range(1, 11):  # a stop made of the last letter of token cut-1 and the first of token cut
        stop = pieces[cut - 1][1] + pieces[cut][0]
        expect = free.text[:free.text.find(stop)]
        for include in (False, True):
            sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop, "zzzz"],
                                include_stop_str_in_output=include)
            deltas, final = stream(llm, prompt, sp)
            want = expect + (stop if include else "")
            assert final.finish_reason == "stop" and final.outputs[0].stop_reason == stop
            assert final.text == want and "".join(deltas) == want, (stop, deltas, want)
            checked += 1
    assert checked == 20
    assert not llm.engine.requests and llm.engine.kv.pool.num_used == 0


def test_stream_without_a_match_sends_everything(tmp_path):
    llm = LLM(two_char_model(tmp_path), load_format="dummy", num_gpu_blocks=32, block_size=4)
    free = llm.generate([[5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    absent = next(s for s in ("09", "#!", "?z") if s not in free.text)
    deltas, final = stream(llm, [5, 6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop=absent))
    assert "".join(deltas) == free.text == final.text and final.finish_reason == "length"


@pytest.mark.parametrize("text, stops, n", [
    ("hello wor", ["world"], 3), ("hello w", ["world", "wx"], 1), ("abc", ["zz"], 0), ("", ["ab"], 0),
    ("xxab", ["abc", "bcd"], 2), ("aaa", ["aab"], 2), ("ab", ["ab"], 0), ("xa", ["ab", "b"], 1),
])
def test_stop_holdback(text, stops, n):
    assert stop_holdback(text, stops) == n


def test_inter_token_latencies_spread_over_speculative_steps():
    assert inter_token_latencies([0.0, 1.0, 1.0, 1.0, 3.0]) == pytest.approx([1 / 3] * 3 + [2.0])
    assert inter_token_latencies([0.0, 0.5, 1.5]) == pytest.approx([0.5, 1.0])
    assert inter_token_latencies([2.0]) == [] and inter_token_latencies([]) == []


def test_speculative_summary_itl_not_zero():
    # The target's own weights as the draft: every draft is accepted, so steps commit several tokens.
    spec = dict(method="draft", model=dict(TINY), load_format="dummy", num_speculative_tokens=3,
                disable_by_batch_size=None)
    llm = LLM(dict(TINY), load_format="dummy", num_gpu_blocks=64, block_size=4, speculative=spec)
    outs = llm.generate([[5, 6, 7], [9, 10]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    assert all(len(o.token_ids) == 12 for o in outs)
    m = outs[0].metrics
    assert len(m.inter_token_latencies) == 11 and min(m.inter_token_latencies) > 0
    s = llm.run_metrics()
    assert s["speculative"] and s["itl_p50_s"] > 0
    assert "ITL p50 0.0 ms" not in format_summary(s)
