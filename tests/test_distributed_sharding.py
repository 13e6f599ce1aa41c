"""The arithmetic of the split, without processes: stage layer ranges, head assignment (even,
uneven, replicated KV heads), vocab padding, and that the shards put back together are the
checkpoint (an independent rebuild of each weight from its pieces)."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
import torch

from llmkern.distributed.sharding import check_parallel, head_split, local_config, shard_state_dict
from llmkern.distributed.topology import Topology
from llmkern.models.config import ModelConfig
from llmkern.models.loader import dummy_state_dict


def cfg(**kw):
    base = dict(arch="qwen2", vocab_size=250, hidden_size=48, intermediate_size=96, num_layers=5, num_heads=6,
                num_kv_heads=3, head_dim=8, qkv_bias=True)
    base.update(kw)
    return ModelConfig(**base)


def test_stage_layers_are_contiguous_and_cover_the_model():
    for L in range(1, 9):
        for P in range(1, L + 1):
            t = Topology(1, P, L)
            spans = [t.layers(s) for s in range(P)]
            assert spans[0][0] == 0 and spans[-1][1] == L
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            sizes = [e - f for f, e in spans]
            assert max(sizes) - min(sizes) <= 1 and max(sizes) == t.max_stage_layers()


@pytest.mark.parametrize("H,Hkv,T", [(6, 3, 2), (6, 3, 3), (4, 2, 2), (4, 1, 2), (8, 2, 4), (8, 8, 4)])
def test_every_query_head_is_placed_once_with_the_kv_head_it_reads(H, Hkv, T):
    c = cfg(num_heads=H, num_kv_heads=Hkv)
    seen = []
    for r in range(T):
        q0, hq, kv0, hkv = head_split(c, T, r)
        for h in range(q0, q0 + hq):
            assert kv0 <= h // (H // Hkv) < kv0 + hkv  # GQA: query head h reads KV head h // group
        seen += range(q0, q0 + hq)
    assert sorted(seen) == list(range(H))


def test_bad_layouts():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        check_parallel(cfg(num_heads=6, num_kv_heads=1), Topology(4, 1, 5))  # 4 does not divide 6 heads
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        check_parallel(cfg(intermediate_size=95), Topology(2, 1, 5))
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        check_parallel(cfg(), Topology(1, 6, 5))


@pytest.mark.parametrize("T,P", [(2, 1), (3, 2), (2, 5)])
def test_shards_reassemble_the_checkpoint(T, P):
    c = cfg()
    sd = dummy_state_dict(c, seed=1)
    topo = Topology(T, P, c.num_layers)
    check_parallel(c, topo)
    shards = {r: shard_state_dict(c, dict(sd), topo, r) for r in range(T * P)}
    D = c.head_dim
    for rank, sh in shards.items():
        local, vstart = local_config(c, topo, rank)
        assert sh["model.embed_tokens.weight"].shape[0] == local.vocab_size == -(-250 // T)
        assert vstart == (rank % T) * local.vocab_size
        first, end = topo.layers(rank // T)
        assert sum(k.endswith("mlp.down_proj.weight") for k in sh) == end - first == local.num_layers
    for stage in range(P):
        ranks = topo.tp_group(stage)
        first, end = topo.layers(stage)
        for i in range(first, end):
            p, q = f"model.layers.{i}.", f"model.layers.{i - first}."
            for name, dim in (("self_attn.q_proj.weight", 0), ("self_attn.q_proj.bias", 0),
                              ("mlp.gate_proj.weight", 0), ("mlp.down_proj.weight", 1), ("self_attn.o_proj.weight", 1)):
                whole = torch.cat([shards[r][q + name] for r in ranks], dim=dim)
                assert torch.equal(whole, sd[p + name]), name
            # K/V: each rank's rows are the KV heads head_split names (replicas included)
            for r in ranks:
                _, _, kv0, hkv = head_split(c, T, r % T)
                for n in ("k_proj.weight", "v_proj.bias"):
                    assert torch.equal(shards[r][q + "self_attn." + n], sd[p + "self_attn." + n][kv0 * D:(kv0 + hkv) * D])
        emb = torch.cat([shards[r]["model.embed_tokens.weight"] for r in ranks])
        assert torch.equal(emb[:250], sd["model.embed_tokens.weight"]) and not emb[250:].any()


@pytest.mark.parametrize("step,only", [(2, []), (1, [0, 3]), (3, [2])])
def test_a_stage_config_knows_which_of_its_layers_are_sparse(step, only):
    # stages renumber their layers from 0; which are MoE must follow the whole model's numbering
    c = cfg(arch="qwen2_moe", num_layers=7, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            decoder_sparse_step=step, mlp_only_layers=only)
    for P in (1, 2, 3):
        t = Topology(1, P, 7)
        got = []
        for s in range(P):
            local, _ = local_config(c, t, s)
            got += [local.is_moe_layer(j) for j in range(local.num_layers)]
        assert got == [(i + 1) % step == 0 and i not in only for i in range(7)]
