"""Mixture-of-experts models: greedy tokens of the engine == HF transformers on tiny random Mixtral,
Qwen2-MoE (shared expert, a dense layer among sparse ones) and Qwen3-MoE (q/k norms) checkpoints
loaded from HF directories by each side's own loader; the same weights written as a llama.cpp
GGUF (gguf's GGUFWriter) and read back; dummy weights in the layout transformers reads."""
from __future__ import annotations

import os
import random

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
transformers = pytest.importorskip("transformers", reason="the parity reference is HF transformers")

import numpy as np

from llmkern import LLM, SamplingParams
from moe_helpers import COMMON, FAMILIES, tiny_moe_model
from runtime_helpers import hf_greedy

NEW = 10


def _prompts():
    rng = random.Random(1)
    shared = [rng.randrange(3, 256) for _ in range(9)]
    ps = [shared + [rng.randrange(3, 256) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    return ps + [[rng.randrange(3, 256) for _ in range(rng.randrange(2, 30))] for _ in range(3)]


PARAMS = SamplingParams(temperature=0, max_tokens=NEW, min_tokens=NEW)


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = tiny_moe_model(path, request.param)
    prompts = _prompts()
    return request.param, path, hf, prompts, hf_greedy(hf, prompts, NEW)


@pytest.mark.parametrize("mode", ["default", "small-chunks-preempt"])
def test_greedy_matches_hf(tiny, mode):
    family, path, _, prompts, ref = tiny
    kw = dict(num_gpu_blocks=256)
    if mode != "default":  # chunked prefill over mixed batches, preemption by recompute
        kw = dict(num_gpu_blocks=14, block_size=4, max_num_batched_tokens=7)
    llm = LLM(path, **kw)
    assert llm.engine.model_config.arch == family
    outs = [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    assert outs == ref
    sparse = [L.moe is not None for L in llm.engine.model.layers]
    assert sparse == [llm.engine.model_config.is_moe_layer(i) for i in range(3)] and any(sparse) and \
        (family == "mixtral" or not all(sparse))
    if mode != "default":
        assert llm.run_metrics()["preemptions"] > 0
    assert llm.engine.kv.pool.num_used == 0


# -- GGUF ---------------------------------------------------------------------------------------
_GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order for llama-arch files (interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: str, family: str, hf, hf_dir: str) -> None:
    """hf's weights (as saved in hf_dir) under llama.cpp's tensor names and metadata, experts
    stacked [E, ...]."""
    import gguf
    from safetensors.numpy import load_file

    c, sd = hf.config, load_file(os.path.join(hf_dir, "model.safetensors"))
    arch = _GGUF_ARCH[family]
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.hidden_size // c.num_attention_heads if family != "qwen3_moe" else c.head_dim)
    w.add_context_length(c.max_position_embeddings)
    w.add_vocab_size(c.vocab_size)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    n_exp = c.num_local_experts if family == "mixtral" else c.num_experts
    w.add_expert_count(n_exp)
    w.add_expert_used_count(c.num_experts_per_tok)
    if family != "mixtral":
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if family == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, c.vocab_size)])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    moe, names = ("block_sparse_moe", ("w1", "w3", "w2")) if family == "mixtral" else \
        ("mlp", ("gate_proj", "up_proj", "down_proj"))
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            q, k = _permute(q, c.num_attention_heads), _permute(k, c.num_key_value_heads)
        for name, t in (("attn_norm", sd[p + "input_layernorm.weight"]), ("attn_q", q), ("attn_k", k),
                        ("attn_v", sd[p + "self_attn.v_proj.weight"]), ("attn_output", sd[p + "self_attn.o_proj.weight"]),
                        ("ffn_norm", sd[p + "post_attention_layernorm.weight"])):
            w.add_tensor(b + name + ".weight", t)
        for n in ("q", "k", "v"):
            if p + f"self_attn.{n}_proj.bias" in sd:
                w.add_tensor(b + f"attn_{n}.bias", sd[p + f"self_attn.{n}_proj.bias"])
        if family == "qwen3_moe":
            w.add_tensor(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            w.add_tensor(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        m = f"{p}{moe}."
        w.add_tensor(b + "ffn_gate_inp.weight", sd[m + "gate.weight"])
        for gg, hf_name in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), names):
            w.add_tensor(b + gg + ".weight", np.stack([sd[f"{m}experts.{e}.{hf_name}.weight"] for e in range(n_exp)]))
        if family == "qwen2_moe":
            for gg, hf_name in (("ffn_gate_shexp", "gate_proj"), ("ffn_up_shexp", "up_proj"),
                                ("ffn_down_shexp", "down_proj")):
                w.add_tensor(b + gg + ".weight", sd[f"{m}shared_expert.{hf_name}.weight"])
            w.add_tensor(b + "ffn_gate_inp_shexp.weight", sd[m + "shared_expert_gate.weight"].reshape(-1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_round_trip(family, tmp_path):
    pytest.importorskip("gguf")
    # llama.cpp's files have every layer sparse; Qwen2-MoE's top-k weights are not renormalised there
    over = {"qwen2_moe": dict(mlp_only_layers=[]), "qwen3_moe": dict(decoder_sparse_step=1)}.get(family, {})
    hf = tiny_moe_model(str(tmp_path / "hf"), family, seed=3, **over)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, family, hf, str(tmp_path / "hf"))
    prompts = _prompts()[2:5]
    ref = hf_greedy(hf, prompts, NEW)
    llm = LLM(path, num_gpu_blocks=128)
    mc = llm.engine.model_config
    n_exp = hf.config.num_local_experts if family == "mixtral" else hf.config.num_experts
    assert (mc.arch, mc.num_experts, mc.num_experts_per_tok) == (family, n_exp, hf.config.num_experts_per_tok)
    assert [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == ref


# -- dummy weights ------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_dummy_weights_load_as_hf_reads_them(family, tmp_path):
    """Dummy weights for a MoE config: the engine runs them, and the same state dict saved as a HF
    directory gives HF's greedy tokens (names and shapes are the family's own)."""
    from llmkern.models.loader import dummy_state_dict, read_hf_config, save_hf_dir

    hf_dir = tmp_path / "cfg"
    tiny_moe_model(str(hf_dir), family)
    cfg = read_hf_config(str(hf_dir / "config.json"))
    llm = LLM(str(hf_dir), load_format="dummy", seed=5, num_gpu_blocks=64)
    assert sum(L.moe is not None for L in llm.engine.model.layers) == sum(cfg.is_moe_layer(i) for i in range(3))
    save_hf_dir(cfg, dummy_state_dict(cfg, seed=5), str(tmp_path / "dummy"))
    hf = getattr(transformers, FAMILIES[family][1]).from_pretrained(str(tmp_path / "dummy")).eval()
    prompts = _prompts()[3:5]
    assert [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == hf_greedy(hf, prompts, NEW)


def test_bad_moe_config():
    cfg = dict(COMMON, model_type="mixtral", num_local_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="num_experts_per_tok: expected 1..4"):
        LLM(cfg, load_format="dummy")
    cfg = dict(COMMON, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
               mlp_only_layers="1")
    with pytest.raises(ValueError, match="mlp_only_layers: expected a list"):
        LLM(cfg, load_format="dummy")


def test_missing_expert_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_moe_model(str(tmp_path), "mixtral")
    f = str(tmp_path / "model.safetensors")
    sd = load_file(f)
    del sd["model.layers.1.block_sparse_moe.experts.7.w2.weight"]  # the last one: a shorter run is no excuse
    save_file(sd, f)
    with pytest.raises(ValueError, match=r"'model.layers.1.block_sparse_moe.experts.7.w2.weight' is missing"):
        LLM(str(tmp_path))
