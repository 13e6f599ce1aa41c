import torch

import llmkern

_K = lambda: torch.randn(4, 2, 8)  # noqa: E731
_C = lambda: torch.zeros(3, 4, 2, 8)  # noqa: E731
_S = lambda: torch.tensor([0, 1, 2, 3])  # noqa: E731
r = llmkern.reshape_and_cache_flash
OPS = ["reshape_and_cache_flash", "copy_blocks", "swap_blocks"]


def _cache_ok(**over):
    args = dict(key=_K(), value=_K(), key_cache=_C(), value_cache=_C(), slot_mapping=_S())
    args.update(over)
    return lambda: r(**args)


CASES = [
    ("rc-key-rank", _cache_ok(key=torch.randn(4, 16)), ValueError, "key"),
    ("rc-cache-rank", _cache_ok(key_cache=torch.zeros(12, 2, 8)), ValueError, "key_cache"),
    ("rc-value-shape", _cache_ok(value=torch.randn(4, 2, 4)), ValueError, "value"),
    ("rc-heads", _cache_ok(key=torch.randn(4, 3, 8), value=torch.randn(4, 3, 8)), ValueError, "key"),
    ("rc-dtype-mismatch", _cache_ok(value=torch.randn(4, 2, 8).half()), TypeError, "value"),
    ("rc-cache-dtype", _cache_ok(key_cache=torch.zeros(3, 4, 2, 8).bfloat16()), TypeError, "key_cache"),
    ("rc-int-data", _cache_ok(key=torch.zeros(4, 2, 8, dtype=torch.int32)), TypeError, "key"),
    ("rc-slot-dtype", _cache_ok(slot_mapping=torch.tensor([0.0, 1, 2, 3])), TypeError, "slot_mapping"),
    ("rc-slot-rank", _cache_ok(slot_mapping=torch.zeros(2, 2, dtype=torch.long)), ValueError, "slot_mapping"),
    ("rc-slot-too-many", _cache_ok(slot_mapping=torch.arange(5)), ValueError, "slot_mapping"),
    ("rc-slot-out-of-range", _cache_ok(slot_mapping=torch.tensor([0, 1, 12, 3])), ValueError, "slot_mapping"),
    ("rc-slot-negative", _cache_ok(slot_mapping=torch.tensor([0, -2, 1, 3])), ValueError, "slot_mapping"),
    ("rc-noncontig-head", _cache_ok(key=torch.randn(4, 8, 2).transpose(1, 2)), ValueError, "key"),
    ("rc-fp4", lambda: r(_K(), _K(), _C(), _C(), _S(), "fp4"), ValueError, "kv_cache_dtype"),
    # fp8 stores uint8 codes: a float cache is the wrong dtype, and the scales are required
    ("rc-fp8-float-cache", lambda: r(_K(), _K(), _C(), _C(), _S(), "fp8", torch.ones(1), torch.ones(1)),
     TypeError, "key_cache"),
    ("rc-fp8-no-scale", lambda: r(_K(), _K(), _C().to(torch.uint8), _C().to(torch.uint8), _S(), "fp8"),
     ValueError, "k_scale"),
    ("rc-not-tensor", lambda: r([1, 2], _K(), _C(), _C(), _S()), TypeError, "key"),
    ("cb-layer-count", lambda: llmkern.copy_blocks([_C()], [_C(), _C()], torch.tensor([[0, 1]])), ValueError, "value_caches"),
    ("cb-map-shape", lambda: llmkern.copy_blocks([_C()], [_C()], torch.tensor([[0, 1, 2]])), ValueError, "block_mapping"),
    ("cb-map-range", lambda: llmkern.copy_blocks([_C()], [_C()], torch.tensor([[0, 3]])), ValueError, "block_mapping"),
    ("cb-map-negative", lambda: llmkern.copy_blocks([_C()], [_C()], torch.tensor([[-1, 0]])), ValueError, "block_mapping"),
    ("cb-map-dtype", lambda: llmkern.copy_blocks([_C()], [_C()], torch.tensor([[0.0, 1.0]])), TypeError, "block_mapping"),
    ("cb-layer-shape", lambda: llmkern.copy_blocks([_C(), torch.zeros(3, 4, 2, 4)], [_C(), _C()], torch.tensor([[0, 1]])), ValueError, "key_caches[1]"),
    ("cb-layer-dtype", lambda: llmkern.copy_blocks([_C()], [_C().half()], torch.tensor([[0, 1]])), TypeError, "value_caches[0]"),
    ("cb-not-list", lambda: llmkern.copy_blocks(_C(), [_C()], torch.tensor([[0, 1]])), TypeError, "key_caches"),
    ("sw-shape", lambda: llmkern.swap_blocks(_C(), torch.zeros(3, 4, 2, 4), torch.tensor([[0, 1]])), ValueError, "dst"),
    ("sw-dtype", lambda: llmkern.swap_blocks(_C(), _C().half(), torch.tensor([[0, 1]])), TypeError, "dst"),
    ("sw-range-src", lambda: llmkern.swap_blocks(_C(), torch.zeros(9, 4, 2, 8), torch.tensor([[5, 1]])), ValueError, "block_mapping"),
    ("sw-range-dst", lambda: llmkern.swap_blocks(torch.zeros(9, 4, 2, 8), _C(), torch.tensor([[5, 3]])), ValueError, "block_mapping"),
    ("sw-noncontig", lambda: llmkern.swap_blocks(torch.zeros(3, 8, 2, 4).transpose(1, 3), torch.zeros(3, 4, 2, 8), torch.tensor([[0, 1]])), ValueError, "src"),
    ("sw-map-dtype", lambda: llmkern.swap_blocks(_C(), _C(), torch.tensor([[0.0, 1.0]])), TypeError, "block_mapping"),
]

# ---- corpus of issue 14 ----
_meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
_cb = llmkern.copy_blocks


def _one_buffer_caches():
    c = _C()
    return _cache_ok(key_cache=c, value_cache=c)


def _key_in_cache():
    c = _C()
    return _cache_ok(key=c.view(-1, 2, 8)[:4], key_cache=c)


CASES += [
    # silent garbage: aliasing, chains
    ("rc-caches-alias", _one_buffer_caches(), ValueError, "value_cache: shares memory with key_cache"),
    ("rc-key-in-cache", _key_in_cache(), ValueError, "key_cache: shares memory with key"),
    ("rc-slot-int64-huge", _cache_ok(slot_mapping=torch.tensor([0, 1, 2 + 2**32, 3])), ValueError, "slot_mapping"),
    ("cb-chain", lambda: _cb([_C()], [_C()], torch.tensor([[0, 1], [1, 2]])), ValueError, "block_mapping"),
    ("cb-chain-reversed", lambda: _cb([_C()], [_C()], torch.tensor([[1, 2], [0, 1]])), ValueError, "block_mapping"),
    ("cb-dst-twice", lambda: _cb([_C()], [_C()], torch.tensor([[0, 2], [1, 2]])), ValueError, "block_mapping"),
    ("cb-map-int64-huge", lambda: _cb([_C()], [_C()], torch.tensor([[0, 1 + 2**32]])), ValueError, "block_mapping"),
    ("sw-same-tensor", (lambda c: lambda: llmkern.swap_blocks(c, c, torch.tensor([[0, 1]])))(_C()), ValueError,
     "dst: shares memory with src"),
    # wrong exception types: meta tensors
    ("rc-key-meta", _cache_ok(key=_meta(4, 2, 8)), ValueError, "key: tensors on device 'meta'"),
    ("rc-cache-meta", _cache_ok(value_cache=_meta(3, 4, 2, 8)), ValueError, "value_cache: tensors on device 'meta'"),
    ("rc-slot-meta", _cache_ok(slot_mapping=torch.tensor([0, 1, 2, 3], device="meta")), ValueError,
     "slot_mapping: tensors on device 'meta'"),
    ("cb-meta", lambda: _cb([_meta(3, 4, 2, 8)], [_C()], torch.tensor([[0, 1]])), ValueError, "key_caches[0]: tensors on device 'meta'"),
    ("cb-map-meta", lambda: _cb([_C()], [_C()], torch.tensor([[0, 1]], device="meta")), ValueError,
     "block_mapping: tensors on device 'meta'"),
    ("sw-meta", lambda: llmkern.swap_blocks(_meta(3, 4, 2, 8), _C(), torch.tensor([[0, 1]])), ValueError, "src: tensors on device 'meta'"),
    # unclear messages: arguments that are not tensors name the argument
    ("rc-value-list", _cache_ok(value=[[1.0]]), TypeError, "value"),
    ("rc-value-none", _cache_ok(value=None), TypeError, "value"),
    ("rc-cache-list", _cache_ok(key_cache=[0.0]), TypeError, "key_cache"),
    ("rc-slot-list", _cache_ok(slot_mapping=[0, 1, 2, 3]), TypeError, "slot_mapping"),
    ("rc-dtype-none", lambda: r(_K(), _K(), _C(), _C(), _S(), None), TypeError, "kv_cache_dtype"),
    ("cb-map-list", lambda: _cb([_C()], [_C()], [[0, 1]]), TypeError, "block_mapping"),
    ("sw-map-list", lambda: llmkern.swap_blocks(_C(), _C(), [[0, 1]]), TypeError, "block_mapping"),
    ("sw-map-none", lambda: llmkern.swap_blocks(_C(), _C(), None), TypeError, "block_mapping"),
]
