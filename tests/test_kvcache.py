"""KV-cache ops: bit-exact against plain torch indexing, on every backend."""
import pytest
import torch

import llmkern
from reference import ref_copy_blocks, ref_reshape_and_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _small(backend):
    return backend.emulated  # the emulator is slow: fewer, smaller cases


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
@pytest.mark.parametrize("block_size", [1, 5, 16, 256])
def test_reshape_and_cache_flash(backend, dtype, head_dim, block_size):
    if _small(backend) and (head_dim in (80, 256) or block_size == 256):
        pytest.skip("emulated backend runs the smaller grid")
    dev = backend.device
    heads, num_tokens = 3, 37
    num_blocks = max(2, (num_tokens * 2) // block_size + 1)
    kc = torch.randn(num_blocks, block_size, heads, head_dim, device=dev).to(dtype)
    vc = torch.randn_like(kc)
    # key/value are strided views of a fused qkv buffer, with padding rows beyond num_tokens
    qkv = torch.randn(num_tokens + 3, 3, heads, head_dim, device=dev).to(dtype)
    key, value = qkv[:, 1], qkv[:, 2]
    slots = torch.randperm(num_blocks * block_size, device=dev)[:num_tokens]
    slots[::7] = -1  # padding tokens are skipped
    for idx_dtype in (torch.int64, torch.int32):
        k_ref, v_ref = ref_reshape_and_cache(key, value, kc, vc, slots)
        k_out, v_out = kc.clone(), vc.clone()
        llmkern.reshape_and_cache_flash(key, value, k_out, v_out, slots.to(idx_dtype))
        assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)


def test_reshape_and_cache_strided_cache(backend):
    # vLLM-style combined cache [num_blocks, 2, block_size, H, D]: K and V are strided views.
    dev = backend.device
    kv = torch.zeros(4, 2, 5, 2, 32, device=dev)
    kc, vc = kv[:, 0], kv[:, 1]
    key, value = torch.randn(6, 2, 32, device=dev), torch.randn(6, 2, 32, device=dev)
    slots = torch.tensor([0, 19, 4, 5, -1, 12], device=dev)
    k_ref, v_ref = ref_reshape_and_cache(key, value, kc, vc, slots)
    llmkern.reshape_and_cache_flash(key, value, kc, vc, slots)
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)


def test_reshape_and_cache_empty(backend):
    kc = torch.zeros(2, 4, 1, 8, device=backend.device)
    key = torch.zeros(0, 1, 8, device=backend.device)
    llmkern.reshape_and_cache_flash(key, key, kc, kc.clone(), torch.zeros(0, dtype=torch.long, device=backend.device))
    assert not kc.any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
@pytest.mark.parametrize("block_size", [1, 5, 16, 256])
@pytest.mark.parametrize("layers,pairs", [(1, 1), (3, 7)])
def test_copy_blocks(backend, dtype, head_dim, block_size, layers, pairs):
    if _small(backend) and (head_dim in (80, 256) or block_size == 256 or dtype == torch.float16):
        pytest.skip("emulated backend runs the smaller grid")
    dev = backend.device
    num_blocks = 2 * pairs + 2
    shape = (num_blocks, block_size, 2, head_dim)
    kcs = [torch.randn(shape, device=dev).to(dtype) for _ in range(layers)]
    vcs = [torch.randn(shape, device=dev).to(dtype) for _ in range(layers)]
    perm = torch.randperm(num_blocks)
    mapping = torch.stack([perm[:pairs], perm[pairs : 2 * pairs]], 1).to(dev)  # distinct src/dst
    ref_k, ref_v = ref_copy_blocks(kcs, vcs, mapping.cpu())
    for idx_dtype in (torch.int64, torch.int32):
        out_k, out_v = [c.clone() for c in kcs], [c.clone() for c in vcs]
        llmkern.copy_blocks(out_k, out_v, mapping.to(idx_dtype))
        for a, b in zip(out_k + out_v, ref_k + ref_v):
            assert torch.equal(a, b)


def test_copy_blocks_empty(backend):
    kc = torch.randn(3, 4, 1, 8, device=backend.device)
    before = kc.clone()
    llmkern.copy_blocks([kc], [kc.clone()], torch.zeros(0, 2, dtype=torch.long, device=backend.device))
    llmkern.copy_blocks([], [], torch.zeros(0, 2, dtype=torch.long))
    assert torch.equal(kc, before)


@pytest.mark.parametrize("mapping", [[[0, 1], [1, 2]], [[1, 2], [0, 1]], [[0, 2], [1, 2]], [[0, 1], [1, 0]]],
                         ids=["chain", "chain-reversed", "dst-twice", "swap"])
def test_copy_blocks_order_dependent_mappings_rejected(backend, mapping):
    """Pairs are independent and run in parallel, so a mapping whose result would depend on their
    order (a destination that is also a source, or written twice) is rejected before anything is
    copied; on every backend (CUDA reads the mapping only under LLMKERN_DEBUG_CHECKS=1)."""
    import os

    if backend.name == "cuda" and os.environ.get("LLMKERN_DEBUG_CHECKS", "0") in ("", "0"):
        pytest.skip("device-side block ids are validated under LLMKERN_DEBUG_CHECKS=1")
    dev = backend.device
    kcs = [torch.randn(4, 3, 2, 8, device=dev) for _ in range(2)]
    vcs = [torch.randn(4, 3, 2, 8, device=dev) for _ in range(2)]
    before = [c.clone() for c in kcs + vcs]
    with pytest.raises(ValueError, match="block_mapping"):
        llmkern.copy_blocks(kcs, vcs, torch.tensor(mapping, device=dev))
    assert all(torch.equal(a, b) for a, b in zip(kcs + vcs, before))
    # independent pairs, including a block copied onto itself, are fine
    ok = torch.tensor([[0, 1], [0, 3], [2, 2]], device=dev)
    ref_k, ref_v = ref_copy_blocks(kcs, vcs, ok.cpu())
    llmkern.copy_blocks(kcs, vcs, ok)
    assert all(torch.equal(a, b) for a, b in zip(kcs + vcs, ref_k + ref_v))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 16])
def test_swap_blocks_cpu_cpu(dtype, block_size):
    src = torch.randn(8, block_size, 2, 64).to(dtype)
    dst = torch.randn(5, block_size, 2, 64).to(dtype)
    mapping = torch.tensor([[7, 0], [2, 4], [3, 1]])
    ref = dst.clone()
    for s, d in mapping.tolist():
        ref[d] = src[s]
    llmkern.swap_blocks(src, dst, mapping)
    assert torch.equal(dst, ref)


@pytest.mark.cuda
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_swap_blocks_cuda(direction):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    sdev, ddev = {"d2h": ("cuda", "cpu"), "h2d": ("cpu", "cuda"), "d2d": ("cuda", "cuda")}[direction]
    src = torch.randn(8, 16, 2, 64, device=sdev)
    dst = torch.randn(6, 16, 2, 64, device=ddev)
    if sdev == "cpu":
        src = src.pin_memory()
    if ddev == "cpu":
        dst = dst.pin_memory()
    mapping = torch.tensor([[7, 0], [2, 5]])
    ref = dst.cpu().clone()
    for s, d in mapping.tolist():
        ref[d] = src[s].cpu()
    llmkern.swap_blocks(src, dst, mapping)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), ref)


def test_opcheck_cache_ops():
    kc = torch.randn(4, 4, 2, 8)
    vc = torch.randn_like(kc)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([0, 3, -1, 9, 15])
    torch.library.opcheck(llmkern.reshape_and_cache_flash.op, (k, v, kc, vc, slots, "auto", None, None))
    torch.library.opcheck(llmkern.copy_blocks.op, ([kc], [vc], torch.tensor([[0, 2]])))
    torch.library.opcheck(llmkern.swap_blocks.op, (kc, vc.clone(), torch.tensor([[1, 3]])))


def test_torch_compile_fullgraph_cache_ops():
    kc = torch.zeros(4, 4, 2, 8)
    vc = torch.zeros_like(kc)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(k, v, slots):
        llmkern.reshape_and_cache_flash(k * 2, v, kc, vc, slots)
        llmkern.copy_blocks([kc], [vc], torch.tensor([[0, 3]]))
        return kc.sum()

    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    step(k, v, torch.tensor([0, 1, 2]))
    assert torch.equal(kc[0, :3], 2 * k) and torch.equal(kc[3], kc[0]) and torch.equal(vc[3, :3], v)
