"""The decode rows' one-call path (layers.attention.paged_attention with rotary: rotate, write the
cache and attend in one flash_attn_with_kvcache call on CPU) against plain torch, and the engine
with and without it: identical greedy tokens."""
from __future__ import annotations

import pytest
import torch

from reference import gather_paged, ref_attention, ref_rotary_rows

pytest.importorskip("numpy", reason="the runtime needs numpy")

from llmkern.layers.attention import AttnMetadata, paged_attention  # noqa: E402
from llmkern.layers.rotary import RotaryEmbedding  # noqa: E402

H, HKV, D, BS = 6, 2, 64, 4


def _batch(dtype, decode_lens, prefill):
    """Caches holding random history, 2 decode rows at decode_lens, one prefill chunk continuing
    a cached prefix (prefill = (cached, new)) or none. Returns what paged_attention takes and what
    the reference needs."""
    g = torch.Generator().manual_seed(0)
    nblk = 64
    kc = torch.randn(nblk, BS, HKV, D, generator=g).to(dtype)
    vc = torch.randn(nblk, BS, HKV, D, generator=g).to(dtype)
    perm = torch.randperm(nblk, generator=g).to(torch.int32)
    seqs = [(n, 1) for n in decode_lens] + ([prefill] if prefill else [])
    tables, at = [], 0
    for cached, new in seqs:
        need = -(-(cached + new) // BS)
        tables.append(perm[at:at + need])
        at += need
    T = sum(new for _, new in seqs)
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k = torch.randn(T, HKV, D, generator=g).to(dtype)
    v = torch.randn(T, HKV, D, generator=g).to(dtype)
    positions = torch.cat([torch.arange(c, c + n) for c, n in seqs])
    slots = torch.cat([tables[i][(positions_i // BS)].long() * BS + positions_i % BS
                       for i, positions_i in enumerate(torch.arange(c, c + n) for c, n in seqs)])
    nd = len(decode_lens)
    width = max(len(t) for t in tables)

    def table(rows):
        out = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, t in enumerate(rows):
            out[i, :len(t)] = t
        return out

    meta = AttnMetadata(slot_mapping=slots, num_decode=nd,
                        decode_seqlens=torch.tensor([n + 1 for n in decode_lens], dtype=torch.int32),
                        decode_block_table=table(tables[:nd]),
                        decode_positions=torch.tensor(decode_lens, dtype=torch.int32))
    if prefill:
        cached, new = prefill
        meta.num_prefill_tokens = new
        meta.prefill_cu_q = torch.tensor([0, new], dtype=torch.int32)
        meta.prefill_cu_k = torch.tensor([0, cached + new], dtype=torch.int32)
        meta.prefill_max_q, meta.prefill_max_k = new, cached + new
        meta.prefill_block_table = table(tables[nd:])
    return q, k, v, kc, vc, positions, meta, seqs, tables


def _reference(q, k, v, kc, vc, positions, seqs, tables, rotary, scale):
    """fp32 rotation (ref_rotary_rows), the rows written into copies of the caches, each row's
    causal attention over its sequence (ref_attention)."""
    half = D // 2
    cos, sin = rotary.cos_sin[:, :half], rotary.cos_sin[:, half:]
    qr = ref_rotary_rows(q, cos, sin, positions, interleaved=False)
    kr = ref_rotary_rows(k, cos, sin, positions, interleaved=False).to(k.dtype)
    kc, vc = kc.clone(), vc.clone()
    out, row = torch.zeros(q.shape), 0
    for (cached, new), t in zip(seqs, tables):
        for i in range(new):
            pos = cached + i
            kc[t[pos // BS], pos % BS], vc[t[pos // BS], pos % BS] = kr[row + i], v[row + i]
        kb, vb = gather_paged(kc, t, cached + new), gather_paged(vc, t, cached + new)
        # q rounded to the storage dtype after rotation, as the kernels store it
        o, _ = ref_attention(qr[row:row + new].to(q.dtype), kb, vb, scale, causal=True)
        out[row:row + new] = o
        row += new
    return out, kc, vc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefill", [None, (9, 5)], ids=["decode-only", "mixed"])
def test_decode_rows_in_one_call_match_torch(dtype, prefill):
    q, k, v, kc, vc, positions, meta, seqs, tables = _batch(dtype, [7, 13], prefill)
    rotary = RotaryEmbedding(D, 10000.0, None, 256, dtype, "cpu")
    scale = D ** -0.5
    ref, ref_kc, ref_vc = _reference(q, k, v, kc, vc, positions, seqs, tables, rotary, scale)
    out = torch.empty_like(q)
    paged_attention(q.clone(), k.clone(), v.clone(), kc, vc, meta, scale, (-1, -1), out, rotary, positions)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (out.float() - ref).abs().max().item() <= tol
    # the written rows: bf16 rotation may differ from the fp32 reference by one rounding
    ktol = 0 if dtype == torch.float32 else 1e-2
    assert (kc.float() - ref_kc.float()).abs().max().item() <= ktol + 1e-6
    assert torch.equal(vc, ref_vc)


@pytest.mark.parametrize("prefill", [None, (9, 5)], ids=["decode-only", "mixed"])
def test_one_call_path_equals_separate_calls(prefill):
    """Same kernels' arithmetic either way: the outputs and caches of the fused and the separate
    (rotary_embedding, reshape_and_cache_flash, flash_attn_with_kvcache) paths agree."""
    dtype = torch.bfloat16
    q, k, v, kc, vc, positions, meta, _, _ = _batch(dtype, [7, 13], prefill)
    rotary = RotaryEmbedding(D, 10000.0, None, 256, dtype, "cpu")
    outs = []
    for fused in (True, False):
        m = AttnMetadata(**{**meta.__dict__, "decode_positions": meta.decode_positions if fused else None})
        kcc, vcc, out = kc.clone(), vc.clone(), torch.empty_like(q)
        paged_attention(q.clone(), k.clone(), v.clone(), kcc, vcc, m, D ** -0.5, (-1, -1), out, rotary, positions)
        outs.append((out, kcc, vcc))
    (o1, k1, v1), (o2, k2, v2) = outs
    assert torch.equal(v1, v2)
    assert (k1.float() - k2.float()).abs().max().item() <= 1e-2  # one bf16 rounding at most
    assert (o1.float() - o2.float()).abs().max().item() <= 2e-2


def test_engine_greedy_identical_with_and_without_the_one_call_path(monkeypatch):
    from llmkern import LLM, SamplingParams
    from llmkern.engine import model_runner

    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=H, num_key_value_heads=HKV, head_dim=D, vocab_size=256,
               max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    prompts = [[5 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((3, 17, 40))]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def run():
        llm = LLM(dict(cfg), load_format="dummy", dtype="float32", num_gpu_blocks=64, block_size=BS,
                  max_num_batched_tokens=24)  # chunked prefill: mixed decode + prefill steps
        return [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]

    fused = run()
    prepare = model_runner.ModelRunner.prepare

    def without(self, batch):
        inputs = prepare(self, batch)
        inputs.meta.decode_positions = None
        return inputs

    monkeypatch.setattr(model_runner.ModelRunner, "prepare", without)
    assert run() == fused
