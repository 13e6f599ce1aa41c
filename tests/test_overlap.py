"""The shared overlap check (csrc/common/overlap.cpp) against brute force: random strided views
of one buffer are passed as an op's output and input; the op must refuse them exactly when the
two views share an element (byte sets computed in torch), and accept every disjoint pair, even
interleaved ones."""
import random

import pytest
import torch

import llmkern


def _index(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Element offsets (into base's storage) of view, by the view's own strides."""
    return torch.arange(base.numel()).as_strided(view.shape, view.stride(), view.storage_offset())


def _elements(view: torch.Tensor, base: torch.Tensor) -> set:
    return set(_index(view, base).flatten().tolist())


def _view(buf, shape, rng):
    """A random view of buf with the last dim contiguous and rows that do not overlap each other."""
    strides, step = [1], shape[-1]
    for n in reversed(shape[:-1]):
        step = step + rng.randrange(0, 3 * shape[-1])  # gaps between rows, some zero
        strides.insert(0, step)
        step *= n
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    off = rng.randrange(0, buf.numel() - span + 1)
    return buf.as_strided(shape, strides, off)


@pytest.mark.parametrize("seed", range(4))
def test_attention_out_vs_q_matches_brute_force(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    hits = misses = 0
    for _ in range(150):
        T, H, D = rng.choice([1, 2, 3]), rng.choice([1, 2, 3]), 8
        buf = torch.randn(400)
        q, out = _view(buf, (T, H, D), rng), _view(buf, (T, H, D), rng)
        k, v = torch.randn(T, H, D), torch.randn(T, H, D)
        cu = torch.tensor([0, T], dtype=torch.int32)
        shared = bool(_elements(q, buf) & _elements(out, buf))
        if shared:
            with pytest.raises(ValueError, match="out: shares memory with q"):
                llmkern.flash_attn_varlen_func(q, k, v, cu, cu, T, T, out=out)
            hits += 1
        else:
            llmkern.flash_attn_varlen_func(q, k, v, cu, cu, T, T, out=out)
            misses += 1
    assert hits > 10 and misses > 10  # both outcomes exercised


@pytest.mark.parametrize("seed", range(4))
def test_rms_norm_out_vs_input_matches_brute_force(seed):
    rng = random.Random(100 + seed)
    w = torch.ones(8)
    hits = misses = 0
    for _ in range(200):
        buf = torch.randn(400)
        rows = rng.choice([1, 2, 4, 6])
        x, out = _view(buf, (rows, 8), rng), _view(buf, (rows, 8), rng)
        same = torch.equal(_index(x, buf), _index(out, buf))  # the same elements in the same order
        shared = bool(_elements(x, buf) & _elements(out, buf))
        if shared and not same:
            with pytest.raises(ValueError, match="out: shares memory with input"):
                llmkern.rms_norm(out, x, w, 1e-6)
            hits += 1
        else:
            llmkern.rms_norm(out, x, w, 1e-6)  # disjoint, or exactly in place
            misses += 1
    assert hits > 10 and misses > 10
