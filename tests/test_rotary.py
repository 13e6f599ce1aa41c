"""rotary_embedding (vLLM signature) on every backend (cpu, simt = the CUDA kernel emulated,
cuda) against rotary embeddings written out in plain torch fp32."""
import pytest
import torch

import llmkern
from llmkern.layers.rotary import cos_sin_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def ref_rope(x, pos, cache, head_size, neox):
    """x [T, heads * head_size] -> rotated copy in fp32; pairs (i, i + r/2) or (2i, 2i + 1)."""
    T = x.shape[0]
    xf = x.float().view(T, -1, head_size).clone()
    rot = cache.shape[1]
    c = cache.float()[pos][:, None, : rot // 2]
    s = cache.float()[pos][:, None, rot // 2:]
    if neox:
        a, b = xf[..., : rot // 2], xf[..., rot // 2: rot]
    else:
        a, b = xf[..., 0:rot:2], xf[..., 1:rot:2]
    na, nb = a * c - b * s, b * c + a * s
    a.copy_(na)
    b.copy_(nb)
    return xf.view(T, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head_size,rot,heads,kv_heads", [(64, 64, 9, 3), (128, 64, 4, 4), (80, 80, 2, 1)])
def test_matches_torch(backend, dtype, neox, head_size, rot, heads, kv_heads):
    dev = backend.device
    T, max_pos = 37, 300
    cache = cos_sin_cache(rot, 10000.0, None, max_pos, dtype, "cpu")
    pos = torch.randint(0, max_pos, (T,))
    # q and k as strided column slices of one fused qkv row, as the model passes them
    qkv = torch.randn(T, (heads + 2 * kv_heads) * head_size).to(dtype)
    qs, ks = heads * head_size, kv_heads * head_size
    ref_q = ref_rope(qkv[:, :qs], pos, cache, head_size, neox)
    ref_k = ref_rope(qkv[:, qs:qs + ks], pos, cache, head_size, neox)
    v_before = qkv[:, qs + ks:].clone()
    qkv_d = qkv.to(dev)
    llmkern.rotary_embedding(pos.to(dev), qkv_d[:, :qs], qkv_d[:, qs:qs + ks], head_size, cache.to(dev), neox)
    out = qkv_d.cpu()
    tol = TOL[dtype] * 4
    assert (out[:, :qs].float() - ref_q).abs().max().item() <= tol
    assert (out[:, qs:qs + ks].float() - ref_k).abs().max().item() <= tol
    assert torch.equal(out[:, qs + ks:], v_before)  # v untouched


def test_query_only_3d_and_int32_positions(backend):
    dev = backend.device
    q = torch.randn(5, 4, 32)
    cache = cos_sin_cache(32, 500000.0, None, 64, torch.float32, "cpu")
    pos = torch.tensor([0, 3, 63, 7, 7], dtype=torch.int32)
    ref = ref_rope(q.view(5, -1), pos.long(), cache, 32, True)
    qd = q.to(dev)
    llmkern.rotary_embedding(pos.to(dev), qd, None, 32, cache.to(dev), True)
    torch.testing.assert_close(qd.cpu().view(5, -1), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(qd.cpu()[0], q[0])  # position 0 is the identity


def test_model_table_matches_hf_rotary():
    """The model's cos/sin cache against transformers' own rotary embedding (Llama 3 scaling)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=500000.0, rope_scaling=scaling,
                      max_position_embeddings=512)
    hf = LlamaRotaryEmbedding(cfg)
    pos = torch.arange(512)[None]
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), pos)
    ours = cos_sin_cache(64, 500000.0, scaling, 512, torch.float32, "cpu")
    torch.testing.assert_close(ours[:, :32], cos[0, :, :32], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[:, 32:], sin[0, :, :32], rtol=1e-5, atol=1e-5)


def test_opcheck_and_compile():
    q, k = torch.randn(3, 2 * 16), torch.randn(3, 16)
    cache = cos_sin_cache(16, 10000.0, None, 8, torch.float32, "cpu")
    pos = torch.tensor([1, 2, 5])
    torch.library.opcheck(llmkern.rotary_embedding.op, (pos, q, k, 16, cache, True))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k):
        q = q * 1
        llmkern.rotary_embedding(pos, q, k, 16, cache, True)
        return q

    q2, k2 = q.clone(), k.clone()
    llmkern.rotary_embedding(pos, q2, k2, 16, cache, True)
    k3 = k.clone()
    torch.testing.assert_close(f(q, k3), q2)
    torch.testing.assert_close(k3, k2)
