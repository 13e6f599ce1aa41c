"""CPU model weights move to one huge-page arena: values, dtypes and shapes are kept, a tensor
shared by two slots (tied embeddings) stays shared, and the model still reads them."""
import torch

from llmkern.models.hugepages import move_to_hugepages


def test_copies_keep_values_and_sharing():
    a = torch.randn(300, 7)
    b = torch.randn(5).to(torch.bfloat16)
    c = torch.arange(10, dtype=torch.int32)
    out = move_to_hugepages([a, b, a, None, c])
    assert out[3] is None
    for src, dst in zip([a, b, a, c], [out[0], out[1], out[2], out[4]]):
        assert dst.dtype == src.dtype and dst.shape == src.shape and torch.equal(dst, src)
        assert dst.data_ptr() != src.data_ptr()  # a copy
        assert dst.data_ptr() % 64 == 0
    assert out[0].data_ptr() == out[2].data_ptr()  # tied stays tied
    out[0].add_(1)  # writable, independent of the source
    assert torch.equal(out[2], a + 1) and not torch.equal(out[0], a)


def test_loaded_model_weights_on_one_arena_and_early_exit_shares_them():
    from llmkern.engine.proposers import early_exit_model
    from llmkern.models.config import ModelConfig
    from llmkern.models.llama import LlamaForCausalLM
    from llmkern.models.loader import dummy_state_dict

    cfg = ModelConfig.from_hf(dict(model_type="llama", hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        vocab_size=128, max_position_embeddings=64, tie_word_embeddings=True))
    sd = dummy_state_dict(cfg, 0)
    ref = {k: v.clone() for k, v in sd.items()}
    m = LlamaForCausalLM.from_state_dict(cfg, sd, torch.float32, "cpu")
    w = ref["model.layers.1.mlp.down_proj.weight"]
    x = torch.randn(3, w.shape[1])
    torch.testing.assert_close(m.layers[1].down(x), x @ w.T)
    assert m.embed is None  # tied: the rows are looked up in the packed head, no second copy
    ids = torch.tensor([0, 17, 127])
    assert torch.equal(m.lm_head.rows(ids), ref["model.embed_tokens.weight"][ids])
    weights = [t for t in m._tensors() if t is not None]
    base = min(t.data_ptr() for t in weights)
    assert max(t.data_ptr() for t in weights) - base < m.weight_bytes + 4096 * len(weights)  # one arena
    d = early_exit_model(m, 1)
    assert d.layers[0].qkv.weight.data_ptr() == m.layers[0].qkv.weight.data_ptr()  # shared, not copied
    assert d.lm_head is m.lm_head


def test_kv_caches_on_one_arena_zeroed_and_disjoint():
    from llmkern.kvcache import alloc_caches

    caches = alloc_caches(7, 4, 3, 2, 8, torch.bfloat16, "cpu")
    flat = [t for pair in caches for t in pair]
    assert len(caches) == 3 and all(t.shape == (7, 4, 2, 8) and t.dtype == torch.bfloat16 for t in flat)
    assert all(torch.count_nonzero(t) == 0 for t in flat)
    for i, t in enumerate(flat):  # writing one leaves every other untouched
        t.fill_(i + 1)
    assert all(torch.all(t == i + 1) for i, t in enumerate(flat))
    starts = sorted(t.data_ptr() for t in flat)
    assert all(b - a >= flat[0].numel() * 2 for a, b in zip(starts, starts[1:]))


def test_hugepage_fraction_reports_the_weights_mapping():
    from llmkern.models.hugepages import hugepage_fraction, move_to_hugepages

    (w,) = move_to_hugepages([torch.randn(1 << 20)])  # 4 MiB: at least one aligned 2 MiB block
    f = hugepage_fraction(w)
    assert f is None or 0.0 <= f <= 1.0
