"""Bad model files, devices and memory requests: a one-line error naming the file, field or
option, from LLM() and from the CLI, never a traceback or an allocation the machine cannot hold."""
from __future__ import annotations

import json
import math

import pytest

np = pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

from llmkern import LLM, cli
from llmkern.kvcache.memory import host_available_bytes

TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


def write_config(tmp_path, cfg) -> str:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return str(d)


def cli_error(argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--quiet"] + argv + ["hi"])
    msg = e.value.code
    assert isinstance(msg, str) and "\n" not in msg.strip(), msg
    return msg


BAD_CONFIGS = [
    ({k: v for k, v in TINY.items() if k != "num_attention_heads"}, "num_attention_heads: missing"),
    (dict(TINY, num_attention_heads=0), "num_attention_heads: expected an integer >= 1, got 0"),
    (dict(TINY, num_key_value_heads=0), "num_key_value_heads: expected an integer >= 1, got 0"),
    (dict(TINY, num_attention_heads=3), "num_attention_heads: 3 does not divide hidden_size 32"),
    (dict(TINY, hidden_size="32"), "hidden_size: expected an integer >= 1, got '32'"),
    (dict(TINY, vocab_size=-5), "vocab_size: expected an integer >= 1"),
    (dict(TINY, rms_norm_eps=float("nan")), "rms_norm_eps: expected a number > 0"),
    ([TINY], "expected a JSON object (the model's config), got list"),
    ("{not json", "not valid JSON"),
]


@pytest.mark.parametrize("cfg, needle", BAD_CONFIGS)
@pytest.mark.parametrize("load_format", ["dummy", "hf"])
def test_bad_config_json(tmp_path, cfg, needle, load_format):
    d = write_config(tmp_path, cfg)
    with pytest.raises(ValueError) as e:
        LLM(d, load_format=load_format)
    assert str(e.value).startswith(f"model: {d}/config.json: ") and needle in str(e.value)
    msg = cli_error(["--model", d, "--load-format", load_format])
    assert f"{d}/config.json" in msg and needle in msg


def test_bad_config_dict():
    with pytest.raises(ValueError, match="^model: config: num_attention_heads: missing"):
        LLM({k: v for k, v in TINY.items() if k != "num_attention_heads"}, load_format="dummy")


def tiny_gguf(path: str) -> None:
    """A small llama GGUF (F32 weights, no tokenizer) written with the gguf package."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(32)
    w.add_vocab_size(40)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((40, 16), dtype=np.float32))
    for name, shape in (("attn_q.weight", (16, 16)), ("attn_k.weight", (8, 16)), ("attn_v.weight", (8, 16)),
                        ("attn_output.weight", (16, 16)), ("ffn_gate.weight", (32, 16)),
                        ("ffn_up.weight", (32, 16)), ("ffn_down.weight", (16, 32))):
        w.add_tensor(f"blk.0.{name}", rng.standard_normal(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_truncated_gguf(tmp_path):
    full = tmp_path / "full.gguf"
    tiny_gguf(str(full))
    data = full.read_bytes()
    for n in (0, 7, 100, len(data) // 2, len(data) - 4):
        p = tmp_path / f"cut{n}.gguf"
        p.write_bytes(data[:n])
        for load_format in ("auto", "dummy"):
            with pytest.raises(ValueError) as e:
                LLM(str(p), load_format=load_format)
            assert str(e.value).startswith(f"model: {p}: not a readable GGUF file"), (n, str(e.value))
        msg = cli_error(["--model", str(p)])
        assert f"{p}: not a readable GGUF file" in msg


def test_gguf_missing_field(tmp_path):
    import gguf

    p = tmp_path / "nohead.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_embedding_length(16)
    w.add_tensor("token_embd.weight", np.zeros((4, 16), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"nohead.gguf: llama.attention.head_count: missing"):
        LLM(str(p), load_format="dummy")


@pytest.mark.parametrize("device", ["tpu", "meta", "cuda:x", "xla"])
def test_bad_device(device):
    with pytest.raises(ValueError) as e:
        LLM(dict(TINY), load_format="dummy", device=device)
    assert str(e.value).startswith("device: ") and "expected 'cpu', 'cuda' or 'cuda:N'" in str(e.value)
    assert repr(device) in str(e.value)


def test_kv_cache_request_larger_than_the_machine():
    avail = host_available_bytes()
    with pytest.raises(ValueError, match=r"^kv_cache_memory_gb: needs .* GiB, but only .* of cpu memory"):
        LLM(dict(TINY), load_format="dummy", device="cpu", kv_cache_memory_gb=1e6)
    # The case: one block of 10**6 tokens of a SmolLM2-shaped cache (30 layers x 3 KV heads x 64,
    # fp32: 46 GB); the block size is raised further where the machine has that much free.
    cfg = dict(TINY, hidden_size=192, num_attention_heads=3, num_key_value_heads=3, num_hidden_layers=30)
    per_token = 2 * 30 * 3 * 64 * 4
    bs = max(10 ** 6, math.ceil(4 * avail / per_token))
    with pytest.raises(ValueError, match=rf"^num_gpu_blocks=1 x block_size={bs} \(KV cache\): needs"):
        LLM(cfg, load_format="dummy", device="cpu", block_size=bs, num_gpu_blocks=1)
    with pytest.raises(ValueError, match=r"^cpu_offload_gb: needs"):
        LLM(dict(TINY), load_format="dummy", device="cpu", cpu_offload_gb=4 * avail / 2 ** 30)
    with pytest.raises(ValueError, match=r"host KV blocks"):
        LLM(dict(TINY), load_format="dummy", device="cpu", num_gpu_blocks=4, enable_prefix_caching=True,
            num_cpu_offload_blocks=4 * avail // (2 * 2 * 2 * 8 * 4 * 16), block_size=16)

