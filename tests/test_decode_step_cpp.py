"""The one-call C++ CPU decode step (models/decode_step.py -> csrc/decoder/): bit-identical to the
Python layer loop (hidden, residual and caches after every step, batch 1 and 4, contexts crossing
block boundaries), close to a plain-torch fp32 forward of each whole sequence, the engine's greedy
tokens unchanged by LLMKERN_DECODE_STEP, the fallbacks taken, bad caches rejected by name."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from reference import ref_attention, ref_rotary_rows

pytest.importorskip("numpy", reason="the runtime needs numpy")

from llmkern.layers.attention import AttnMetadata  # noqa: E402
from llmkern.layers.embed_head import embed_tokens  # noqa: E402
from llmkern.layers.linear import GEMV_ROWS, Linear  # noqa: E402
from llmkern.layers.rotary import inv_freq  # noqa: E402
from llmkern.models import decode_step as ds  # noqa: E402
from llmkern.models.config import ModelConfig  # noqa: E402
from llmkern.models.llama import LlamaForCausalLM  # noqa: E402
from llmkern.models.loader import dummy_state_dict  # noqa: E402

H, HKV, D, BS, NBLK = 6, 2, 64, 4, 48
BASE = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=H,
            num_key_value_heads=HKV, head_dim=D, vocab_size=256, max_position_embeddings=256, bos_token_id=1,
            eos_token_id=2)


def _weights(qk_norm=False, **over):
    """A tiny random config and fp32 HF-named weights (std 0.1, norms around 1 so they matter)."""
    cfg = ModelConfig.from_hf({**BASE, **over})
    if qk_norm:
        cfg = dataclasses.replace(cfg, qk_norm=True)
    sd = dummy_state_dict(cfg, seed=1, std=0.1)
    g = torch.Generator().manual_seed(2)
    for k in sd:
        if "norm" in k:
            sd[k] = 1 + 0.2 * torch.randn(sd[k].shape, generator=g)
    return cfg, sd


def _model(dtype, **kw):
    cfg, sd = _weights(**kw)
    return LlamaForCausalLM.from_state_dict(cfg, dict(sd), dtype, "cpu"), cfg, sd


def _caches(cfg, dtype):
    return [(torch.zeros(NBLK, BS, HKV, D, dtype=dtype), torch.zeros(NBLK, BS, HKV, D, dtype=dtype))
            for _ in range(cfg.num_layers)]


def _meta(lens, tables):
    """Decode metadata: sequence b holds lens[b] tokens and adds one."""
    pos = torch.tensor(lens, dtype=torch.int32)
    width = max(len(t) for t in tables)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    slots = torch.tensor([tables[i][n // BS] * BS + n % BS for i, n in enumerate(lens)], dtype=torch.int64)
    return AttnMetadata(slot_mapping=slots, num_decode=len(lens), decode_seqlens=pos + 1,
                        decode_block_table=bt, decode_positions=pos)


def _schedule(batch):
    """Steps (sequences taking part) that stagger the sequences' lengths, then run them together
    across block boundaries: sequence b first decodes alone for 3 * b tokens."""
    steps = [[b] for b in range(batch) for _ in range(3 * b)]
    return steps + [list(range(batch))] * 10


def _tokens(batch, n):
    g = torch.Generator().manual_seed(3)
    return torch.randint(3, 256, (batch, n), generator=g)


def _tables(batch):
    perm = torch.randperm(NBLK, generator=torch.Generator().manual_seed(4)).tolist()
    return [perm[b * 8:(b + 1) * 8] for b in range(batch)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("variant", ["llama", "qwen2-bias", "qk-norm", "window"])
def test_cpp_step_bit_identical_to_python_loop(dtype, batch, variant):
    kw = {"llama": {}, "qwen2-bias": dict(model_type="qwen2"), "qk-norm": dict(qk_norm=True),
          "window": dict(model_type="mistral", sliding_window=5)}[variant]
    model, cfg, _ = _model(dtype, **kw)
    step = model.decode_step()
    assert step is not None, "the tiny model's projections must all be kinds the C++ step knows"
    c_cpp, c_py = _caches(cfg, dtype), _caches(cfg, dtype)
    tables, lens = _tables(batch), [0] * batch
    toks = _tokens(batch, 32)
    for rows in _schedule(batch):
        meta = _meta([lens[b] for b in rows], [tables[b] for b in rows])
        ids = torch.stack([toks[b, lens[b]] for b in rows])
        residual = embed_tokens(ids, model.embed, model.lm_head)
        hidden = torch.empty_like(residual)
        step(hidden, residual, meta, c_cpp)
        model.is_last_stage = False  # the Python loop, stopping where the C++ step does
        try:
            ref_hidden, ref_residual = model.forward(ids, meta.decode_positions.long(), meta, c_py)
        finally:
            model.is_last_stage = True
        assert torch.equal(hidden, ref_hidden)
        assert torch.equal(residual, ref_residual)
        for (k1, v1), (k2, v2) in zip(c_cpp, c_py):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)
        for b in rows:
            lens[b] += 1
    assert max(lens) > 2 * BS  # crossed block boundaries


def test_profiled_step_times_its_phases_and_keeps_its_bits():
    """set_profiling: the same results as an unprofiled step; steps and rows counted; every phase
    timed, their sum within the calls' own wall time; off stops the totals, on again clears them."""
    import time

    from llmkern.ops.decoder import PHASES

    model, cfg, _ = _model(torch.bfloat16)
    plain, timed = model.decode_step(), _model(torch.bfloat16)[0].decode_step()
    timed.impl.set_profiling(True)
    c_plain, c_timed = _caches(cfg, torch.bfloat16), _caches(cfg, torch.bfloat16)
    tables, lens, toks = _tables(3), [0] * 3, _tokens(3, 32)
    wall, steps, rows_total = 0.0, 0, 0
    for rows in _schedule(3):
        meta = _meta([lens[b] for b in rows], [tables[b] for b in rows])
        ids = torch.stack([toks[b, lens[b]] for b in rows])
        outs = []
        for step, caches in ((plain, c_plain), (timed, c_timed)):
            residual = embed_tokens(ids, model.embed, model.lm_head)
            hidden = torch.empty_like(residual)
            t0 = time.perf_counter()
            step(hidden, residual, meta, caches)
            if step is timed:
                wall += time.perf_counter() - t0
            outs.append((hidden, residual))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        steps, rows_total = steps + 1, rows_total + len(rows)
        for b in rows:
            lens[b] += 1
    prof = timed.impl.profile()
    assert (prof["steps"], prof["rows"]) == (steps, rows_total)
    assert set(prof["seconds"]) == set(PHASES)
    assert all(v > 0 for v in prof["seconds"].values()), prof
    assert sum(prof["seconds"].values()) <= wall
    timed.impl.set_profiling(False)
    meta = _meta([lens[0]], [tables[0]])
    residual = embed_tokens(toks[:1, lens[0]], model.embed, model.lm_head)
    timed(torch.empty_like(residual), residual, meta, c_timed)
    assert timed.impl.profile() == prof  # off: nothing added
    timed.impl.set_profiling(True)
    assert timed.impl.profile() == {"steps": 0, "rows": 0, "seconds": dict.fromkeys(PHASES, 0.0)}


def _ref_forward(cfg, sd, tokens, dtype):
    """Plain torch, one whole sequence from position 0: the final-normed hidden states [n, hidden].
    Matmuls in `dtype` (the tolerance rule's same-dtype baseline) or fp32; norms and rotation in
    fp32 as HF does."""
    w = {k: v.to(dtype) for k, v in sd.items()}
    eps, n = cfg.rms_norm_eps, len(tokens)

    def norm(x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype) * weight

    f = inv_freq(D, cfg.rope_theta, cfg.rope_scaling)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * f[None, :]
    cos, sin, pos = ang.cos(), ang.sin(), torch.arange(n)
    window = (cfg.sliding_window - 1, 0) if cfg.sliding_window else (-1, -1)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q, k, v = (F.linear(h, w[p + f"self_attn.{m}_proj.weight"], w.get(p + f"self_attn.{m}_proj.bias"))
                   for m in "qkv")
        q, k, v = q.view(n, H, D), k.view(n, HKV, D), v.view(n, HKV, D)
        if cfg.qk_norm:
            q, k = norm(q, w[p + "self_attn.q_norm.weight"]), norm(k, w[p + "self_attn.k_norm.weight"])
        q = ref_rotary_rows(q, cos, sin, pos, interleaved=False).to(dtype)
        k = ref_rotary_rows(k, cos, sin, pos, interleaved=False).to(dtype)
        o, _ = ref_attention(q, k, v, D ** -0.5, causal=True, window=window, compute_dtype=dtype)
        x = x + F.linear(o.to(dtype).reshape(n, H * D), w[p + "self_attn.o_proj.weight"])
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        act = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(act, w[p + "mlp.down_proj.weight"])
    return norm(x, w["model.norm.weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpp_step_matches_plain_torch(dtype, monkeypatch):
    """The model's output rows through the C++ step against a whole-sequence fp32 forward:
    max|out - ref| <= 2 * max|torch in the model dtype - ref| + tiny."""
    batch = 4
    model, cfg, sd = _model(dtype)
    sd32 = {k: v.to(dtype).float() for k, v in sd.items()}  # the weights the model holds
    caches, tables, lens = _caches(cfg, dtype), _tables(batch), [0] * batch
    toks = _tokens(batch, 32)
    used = []
    orig = ds.DecoderStep.__call__
    monkeypatch.setattr(ds.DecoderStep, "__call__", lambda self, *a: (used.append(1), orig(self, *a))[1])
    outs = {b: [] for b in range(batch)}
    for rows in _schedule(batch):
        meta = _meta([lens[b] for b in rows], [tables[b] for b in rows])
        ids = torch.stack([toks[b, lens[b]] for b in rows])
        out = model.forward(ids, meta.decode_positions.long(), meta, caches)
        for r, b in enumerate(rows):
            outs[b].append(out[r].float())
            lens[b] += 1
    assert len(used) == len(_schedule(batch))
    for b in range(batch):
        got = torch.stack(outs[b])
        ref = _ref_forward(cfg, sd32, toks[b, :lens[b]], torch.float32)
        same = _ref_forward(cfg, sd32, toks[b, :lens[b]], dtype).float()
        tol = 2 * (same - ref).abs().max().item() + 1e-4
        assert (got - ref).abs().max().item() <= tol


def test_engine_greedy_identical_with_and_without(monkeypatch, tmp_path):
    from llmkern import LLM, SamplingParams
    from llmkern.models.loader import save_hf_dir

    cfg, sd = _weights()
    save_hf_dir(cfg, sd, str(tmp_path))
    prompts = [[5 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((3, 17, 40, 9))]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    calls = []
    orig = ds.DecoderStep.__call__
    monkeypatch.setattr(ds.DecoderStep, "__call__", lambda self, *a: (calls.append(a[0].shape[0]), orig(self, *a))[1])
    for dtype in ("float32", "bfloat16"):
        runs = {}
        for flag in ("1", "0"):
            monkeypatch.setenv("LLMKERN_DECODE_STEP", flag)
            calls.clear()
            llm = LLM(str(tmp_path), dtype=dtype, num_gpu_blocks=64, block_size=BS, max_num_batched_tokens=24)
            runs[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
            assert bool(calls) == (flag == "1")
        assert runs["1"] == runs["0"]
        assert len({tuple(t) for t in runs["1"]}) > 1  # not a degenerate model


def test_fallbacks(monkeypatch):
    model, cfg, _ = _model(torch.bfloat16)
    step = model.decode_step()
    assert step is not None
    meta = _meta([3], [[1, 2]])
    assert step.accepts(1, meta)
    assert not step.accepts(2, meta)  # a prefill row beside the decode row
    mixed = dataclasses.replace(meta, num_prefill_tokens=1)
    assert not step.accepts(2, mixed)
    assert not step.accepts(1, dataclasses.replace(meta, decode_positions=None))
    # unpacked (fp16) projections run through torch beyond GEMV_ROWS rows: the Python loop does that
    big = _meta([3] * (GEMV_ROWS + 1), [[1, 2]] * (GEMV_ROWS + 1))
    half = _model(torch.float16)[0].decode_step()
    assert half.accepts(GEMV_ROWS, _meta([3] * GEMV_ROWS, [[1, 2]] * GEMV_ROWS))
    assert not half.accepts(GEMV_ROWS + 1, big)
    fp32, _, _ = _model(torch.float32)
    assert fp32.decode_step().accepts(GEMV_ROWS + 1, big)  # packed fp32 GEMM: any rows

    # a mixed batch through forward: the step is not called
    calls = []
    monkeypatch.setattr(ds.DecoderStep, "__call__", lambda self, *a: calls.append(1))
    caches = _caches(cfg, torch.bfloat16)
    m = _meta([0], [[5, 6]])
    m.num_prefill_tokens, m.prefill_cu_q, m.prefill_max_q = 3, torch.tensor([0, 3], dtype=torch.int32), 3
    m.slot_mapping = torch.tensor([5 * BS, 9 * BS, 9 * BS + 1, 9 * BS + 2])
    model.forward(torch.tensor([7, 8, 9, 10]), torch.tensor([0, 0, 1, 2]), m, caches)
    assert not calls
    model.tp_reduce = lambda t: None  # tensor parallel: partial sums need the loop's reduces
    model.forward(torch.tensor([7]), torch.tensor([0]), _meta([0], [[5]]), caches)
    assert not calls
    model.tp_reduce = None

    monkeypatch.setenv("LLMKERN_DECODE_STEP", "0")
    off, _, _ = _model(torch.float32)
    assert off.decode_step() is None
    monkeypatch.delenv("LLMKERN_DECODE_STEP")

    class OtherLinear(Linear):  # a projection kind the C++ step does not know
        __slots__ = ()

    odd, _, _ = _model(torch.float32)
    odd.layers[1].o.__class__ = OtherLinear
    assert odd.decode_step() is None

    odd, _, _ = _model(torch.float32)
    odd.layers[0].down = None
    odd.layers[0].moe = object()  # a sparse layer
    assert odd.decode_step() is None


def test_moe_model_falls_back():
    cfg = ModelConfig.from_hf(dict(BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2))
    model = LlamaForCausalLM.from_state_dict(cfg, dummy_state_dict(cfg), torch.float32, "cpu")
    assert model.decode_step() is None


def test_bad_caches_name_the_argument():
    model, cfg, _ = _model(torch.float32)
    step = model.decode_step()
    meta = _meta([0], [[1]])
    residual = torch.zeros(1, cfg.hidden_size)
    hidden = torch.empty_like(residual)
    good = _caches(cfg, torch.float32)
    wrong_dtype = [good[0], (good[1][0].to(torch.bfloat16), good[1][1])]
    with pytest.raises(TypeError, match=r"kv_caches\[1\]\[0\]"):
        step(hidden, residual, meta, wrong_dtype)
    wrong_shape = [(good[0][0], good[0][1][:, :, :1]), good[1]]
    with pytest.raises(ValueError, match=r"kv_caches\[0\]\[1\]"):
        step(hidden, residual, meta, wrong_shape)
    with pytest.raises(ValueError, match="kv_caches"):
        step(hidden, residual, meta, good[:1])
    with pytest.raises(ValueError, match="hidden"):
        step(torch.empty(2, cfg.hidden_size), residual, meta, good)
    with pytest.raises(ValueError, match="hidden"):
        step(residual, residual, meta, good)
    with pytest.raises(TypeError, match="decode_positions"):
        step(hidden, residual, dataclasses.replace(meta, decode_positions=meta.decode_positions.long()), good)
    # a block id past the cache: the kernel's range check, with the layer named
    with pytest.raises(ValueError, match="layer 0"):
        step(hidden, residual, _meta([0], [[NBLK + 3]]), good)
    step(hidden, residual, meta, good)
    assert torch.isfinite(hidden).all()


def test_cache_list_longer_than_the_layers():
    """An engine's cache list may hold a draft model's layers after the target's: the step uses
    the first num_layers pairs, as the Python loop does."""
    model, cfg, _ = _model(torch.float32)
    meta = _meta([0], [[1]])
    ids = torch.tensor([9])
    caches = _caches(cfg, torch.float32)
    extra = caches + _caches(cfg, torch.float32)
    out = model.forward(ids, meta.decode_positions.long(), meta, extra)
    model._decode_step = None
    ref = model.forward(ids, meta.decode_positions.long(), meta, _caches(cfg, torch.float32))
    assert torch.equal(out, ref)
    assert all(not k.any() and not v.any() for k, v in extra[cfg.num_layers:])
