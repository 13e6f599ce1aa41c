"""The CUDA attention kernels (csrc/attention/*.cu): on the SIMT emulator (always) and on a GPU
(marker `cuda`, skipped without one), against the plain-torch references, plus cross-backend
agreement (CPU kernels vs CUDA kernels on the same inputs) and CUDA-graph capture of a decode
step.

Each case is chosen to reach one kernel path: the tensor-core prefill kernel (head-dim classes
64 / 128 / 256, padded head dims, GQA packing, paged K/V with any page size, split-KV), the
decode-shaped kernel (one and several row tiles, split-KV + combine, in-place append), and the
fp32 CUDA-core kernel. Shapes stay small: the emulator runs every thread of every block.
"""
from __future__ import annotations

import pytest
import torch

import llmkern
from reference import ref_kvcache, ref_varlen

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
GPU_BACKENDS = ["simt", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=GPU_BACKENDS)
def gpu_backend(request):
    """The CUDA kernel sources: emulated (simt) or on a real GPU (cuda)."""
    from conftest import _enter

    ctx, b = _enter(request.param)
    if ctx is None:
        yield b
    else:
        with ctx:
            yield b


def _floor(dtype):
    return 2e-5 if dtype == FP32 else 2e-3


def assert_fa_close(out, ref, same, what=""):
    """flash-attn's rule: error <= 2 x the error of the same computation in the input dtype."""
    err = (out.float().cpu() - ref.cpu()).abs().max().item() if out.numel() else 0.0
    base = (same.float().cpu() - ref.cpu()).abs().max().item() if same.numel() else 0.0
    bound = 2 * base + _floor(out.dtype)
    assert err <= bound, f"{what}: max error {err:.3e} > {bound:.3e} (same-dtype torch error {base:.3e})"


def assert_lse_close(lse, ref, what=""):
    lse, ref = lse.cpu(), ref.cpu()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref)), f"{what}: empty rows differ (lse = +inf)"
    fin = torch.isfinite(ref)
    if fin.any():
        err = (lse[fin] - ref[fin]).abs().max().item()
        assert err < 2e-3, f"{what}: lse error {err:.3e}"


def _cu(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _paged(rows_per_seq, block_size, device, extra_blocks=3):
    """Scatter each sequence's rows [len, H, D] into a cache with a random, non-contiguous block
    table. Returns (cache, block_table)."""
    nblk = [(r.shape[0] + block_size - 1) // block_size for r in rows_per_seq]
    total = sum(nblk) + extra_blocks
    h, d = rows_per_seq[0].shape[1:]
    cache = torch.randn(total, block_size, h, d).to(rows_per_seq[0].dtype)
    perm = torch.randperm(total)
    table = torch.zeros(len(rows_per_seq), max(nblk + [1]), dtype=torch.int32)
    used = 0
    for b, rows in enumerate(rows_per_seq):
        blocks = perm[used:used + nblk[b]]
        used += nblk[b]
        table[b, :nblk[b]] = blocks.int()
        for j in range(rows.shape[0]):
            cache[blocks[j // block_size], j % block_size] = rows[j]
    return cache.to(device), table.to(device)


def run_varlen(dev, dtype, D, lens_q, lens_k, hq, hkv, page=None, out_given=False, **kw):
    """flash_attn_varlen_func vs ref_varlen; returns (out, lse) for cross-backend checks."""
    q = torch.randn(sum(lens_q), hq, D).to(dtype)
    k = torch.randn(sum(lens_k), hkv, D).to(dtype)
    v = torch.randn(sum(lens_k), hkv, D).to(dtype)
    cu_q, cu_k = _cu(lens_q, "cpu"), _cu(lens_k, "cpu")
    bt = None
    if page:
        ks = [k[cu_k[b]:cu_k[b + 1]] for b in range(len(lens_k))]
        vs = [v[cu_k[b]:cu_k[b + 1]] for b in range(len(lens_k))]
        state = torch.random.get_rng_state()
        k, bt = _paged(ks, page, "cpu")
        torch.random.set_rng_state(state)
        v, bt_v = _paged(vs, page, "cpu")
        assert torch.equal(bt, bt_v)
    scale = kw.pop("scale", D ** -0.5)
    ref_kw = dict(causal=kw.get("causal", False), window=kw.get("window", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi=kw.get("alibi"))
    ref, lse_ref = ref_varlen(q, k, v, cu_q, cu_k, scale, block_table=bt, **ref_kw)
    same, _ = ref_varlen(q, k, v, cu_q, cu_k, scale, block_table=bt, compute_dtype=dtype, **ref_kw)
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    out = torch.full_like(q, 7.0).to(dev) if out_given else None
    o, lse = llmkern.flash_attn_varlen_func(
        to(q), to(k), to(v), to(cu_q), to(cu_k), max(lens_q + [0]), max(lens_k + [0]),
        softmax_scale=scale, causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
        softcap=kw.get("softcap", 0.0), alibi_slopes=to(kw.get("alibi")), return_softmax_lse=True,
        block_table=to(bt), out=out)
    if out_given:
        assert o is out
    assert_fa_close(o, ref, same, "out")
    assert_lse_close(lse, lse_ref, "lse")
    return o, lse


# ---- tensor-core prefill / fp32 CUDA-core kernel ----------------------------------------------

PREFILL_CASES = [
    # id, dtype, D, lens_q, lens_k, hq, hkv, page, kwargs
    ("bf16-hd64-causal", BF16, 64, [40, 3], [40, 70], 4, 2, None, dict(causal=True)),
    ("fp16-hd128-causal", FP16, 128, [150], [170], 2, 2, None, dict(causal=True)),
    ("fp16-hd256-causal", FP16, 256, [70], [70], 2, 2, None, dict(causal=True)),
    ("bf16-hd256-softcap", BF16, 256, [20, 70], [20, 100], 2, 1, None, dict(causal=True, softcap=5.0)),
    ("bf16-hd80-ragged-empty", BF16, 80, [33, 0, 17, 5], [50, 9, 0, 5], 6, 2, None, dict(causal=True)),
    ("fp16-hd96-window", FP16, 96, [65], [65], 3, 1, None, dict(window=(10, 3))),
    ("bf16-hd136-noncausal", BF16, 136, [70], [45], 2, 1, None, {}),
    ("bf16-hd128-alibi-mqa8", BF16, 128, [50], [80], 8, 1, None, dict(causal=True, alibi=torch.rand(8))),
    ("bf16-hd64-alibi-batch", BF16, 64, [40, 36], [60, 36], 3, 3, None, dict(alibi=torch.rand(2, 3))),
    ("bf16-sq-gt-sk", BF16, 64, [200], [10], 2, 1, None, dict(causal=True)),
    ("fp16-scale", FP16, 64, [48], [48], 2, 1, None, dict(causal=True, scale=0.3)),
    ("bf16-paged1", BF16, 64, [70], [70], 2, 2, 1, dict(causal=True)),
    ("bf16-paged5", BF16, 64, [45, 30], [60, 140], 4, 4, 5, dict(causal=True)),
    ("fp16-paged16-prefix", FP16, 128, [40], [300], 3, 1, 16, dict(causal=True)),
    ("bf16-paged256-window", BF16, 64, [33, 64], [300, 64], 2, 1, 256, dict(window=(50, 0))),
    ("fp32-hd64-causal", FP32, 64, [7, 40], [9, 50], 4, 2, None, dict(causal=True)),
    ("fp32-hd80-paged3-all", FP32, 80, [20, 5], [50, 7], 6, 2, 3, dict(causal=True, softcap=3.0, alibi=torch.rand(6))),
    ("fp32-hd256-window", FP32, 256, [9], [40], 2, 1, None, dict(window=(5, 2))),
    ("bf16-gqa-pack", BF16, 64, [9, 6], [30, 20], 16, 2, None, dict(causal=True)),  # rows > 32, packed
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
def test_varlen(gpu_backend, case):
    _, dtype, D, lq, lk, hq, hkv, page, kw = case
    run_varlen(gpu_backend.device, dtype, D, lq, lk, hq, hkv, page=page, **dict(kw))


@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_varlen_out_given(gpu_backend, dtype):
    run_varlen(gpu_backend.device, dtype, 64, [20, 13], [20, 30], 2, 1, out_given=True, causal=True)


def test_varlen_all_empty(gpu_backend):
    run_varlen(gpu_backend.device, BF16, 64, [0, 0], [5, 0], 2, 1)


# ---- decode-shaped kernel: flash_attn_with_kvcache ----------------------------------------------

def run_kvcache(dev, dtype, D, lens, s, hq, hkv, page=None, append=False, num_splits=1, **kw):
    b = len(lens)
    s_new = s if append else 0
    cap = max(lens) + s_new + 3
    kd = torch.randn(b, cap, hkv, D).to(dtype)
    vd = torch.randn(b, cap, hkv, D).to(dtype)
    if page:
        state = torch.random.get_rng_state()
        kc, bt = _paged([kd[i] for i in range(b)], page, "cpu")
        torch.random.set_rng_state(state)
        vc, _ = _paged([vd[i] for i in range(b)], page, "cpu")
    else:
        kc, vc, bt = kd, vd, None
    q = torch.randn(b, s, hq, D).to(dtype)
    kn = torch.randn(b, s_new, hkv, D).to(dtype) if append else None
    vn = torch.randn(b, s_new, hkv, D).to(dtype) if append else None
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = D ** -0.5
    ref_kw = dict(causal=kw.get("causal", False), window=kw.get("window", (-1, -1)),
                  softcap=kw.get("softcap", 0.0), alibi=kw.get("alibi"))
    ref, lse_ref, kc_ref, vc_ref = ref_kvcache(q, kc, vc, lens_t, scale, k=kn, v=vn, block_table=bt, **ref_kw)
    same, _, _, _ = ref_kvcache(q, kc, vc, lens_t, scale, k=kn, v=vn, block_table=bt,
                                compute_dtype=dtype, **ref_kw)
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    kc_d, vc_d = kc.clone().to(dev), vc.clone().to(dev)
    o, lse = llmkern.flash_attn_with_kvcache(
        to(q), kc_d, vc_d, k=to(kn), v=to(vn), cache_seqlens=to(lens_t), block_table=to(bt),
        causal=kw.get("causal", False), window_size=kw.get("window", (-1, -1)),
        softcap=kw.get("softcap", 0.0), alibi_slopes=to(kw.get("alibi")), num_splits=num_splits,
        return_softmax_lse=True)
    assert_fa_close(o, ref, same, "out")
    assert_lse_close(lse, lse_ref, "lse")
    if append:
        assert torch.equal(kc_d.cpu(), kc_ref) and torch.equal(vc_d.cpu(), vc_ref), "appended cache rows"
    return o, lse


DECODE_CASES = [
    # id, dtype, D, lens, s, hq, hkv, page, append, num_splits, kwargs
    ("bf16-hd128-gqa4", BF16, 128, [33, 1, 200], 1, 8, 2, None, False, 1, {}),
    ("fp16-hd64-paged16", FP16, 64, [70, 17], 1, 4, 1, 16, False, 1, {}),
    ("bf16-hd256-paged5-append", BF16, 256, [40, 11], 1, 2, 1, 5, True, 1, {}),
    ("bf16-hd64-verify-s3-append", BF16, 64, [30, 50], 3, 8, 2, 16, True, 1, dict(causal=True)),
    ("bf16-hd136-two-row-tiles", BF16, 136, [33, 100], 3, 16, 2, None, False, 1, dict(causal=True, alibi=torch.rand(2, 16))),
    ("fp16-hd128-splits4", FP16, 128, [300, 90, 0], 1, 4, 2, 16, False, 4, {}),
    ("bf16-hd64-splits3-append", BF16, 64, [150, 77], 2, 8, 2, 1, True, 3, dict(causal=True)),
    ("bf16-hd96-splits5-window", BF16, 96, [260], 1, 3, 3, None, False, 5, dict(window=(40, 0), softcap=4.0)),
    ("fp32-hd64-paged5-append", FP32, 64, [40, 3], 2, 6, 2, 5, True, 1, dict(causal=True)),
    ("fp32-hd128-splits3", FP32, 128, [100, 7], 1, 4, 1, None, False, 3, {}),
    ("bf16-prefill-kernel-splits2", BF16, 64, [60], 8, 16, 2, 16, True, 2, dict(causal=True)),  # 64 rows
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_kvcache(gpu_backend, case):
    _, dtype, D, lens, s, hq, hkv, page, append, ns, kw = case
    run_kvcache(gpu_backend.device, dtype, D, lens, s, hq, hkv, page=page, append=append,
                num_splits=ns, **dict(kw))


@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_append_from_unaligned_views(gpu_backend, dtype):
    # New k/v rows that are views 1 element off a 16-byte boundary take the element-wise append.
    dev = gpu_backend.device
    b, s, hkv, d = 2, 3, 2, 64
    kc = torch.randn(b, 20, hkv, d, device=dev).to(dtype)
    vc = torch.randn_like(kc)
    base_k = torch.randn(b, s, hkv, d + 1, device=dev).to(dtype)
    base_v = torch.randn(b, s, hkv, d + 1, device=dev).to(dtype)
    kn, vn = base_k[..., 1:], base_v[..., 1:]
    lens = torch.tensor([4, 11], dtype=torch.int32, device=dev)
    q = torch.randn(b, s, 4, d, device=dev).to(dtype)
    _, _, kc_ref, vc_ref = ref_kvcache(q.cpu(), kc.cpu(), vc.cpu(), lens.cpu(), d ** -0.5, k=kn.cpu(), v=vn.cpu())
    llmkern.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
    assert torch.equal(kc.cpu(), kc_ref) and torch.equal(vc.cpu(), vc_ref)


def test_misaligned_rows_rejected_on_gpu(gpu_backend):
    # A q view whose rows start 2 bytes off a 16-byte boundary: the 16-byte copies cannot load
    # it, and the error names the argument instead of reading garbage.
    dev = gpu_backend.device
    base = torch.randn(10, 2, 72, device=dev).to(BF16)
    q = base[:, :, 1:65]
    k = torch.randn(10, 2, 64, device=dev).to(BF16)
    cu = torch.tensor([0, 10], dtype=torch.int32, device=dev)
    with pytest.raises(NotImplementedError, match="^q"):
        llmkern.flash_attn_varlen_func(q, k, k, cu, cu, 10, 10)


# ---- cross-backend agreement: CPU kernels vs CUDA kernels on the same inputs --------------------

CROSS = [
    ("varlen-causal", lambda dev: run_varlen(dev, BF16, 64, [30, 12], [30, 50], 4, 2, causal=True)),
    ("paged-prefill", lambda dev: run_varlen(dev, FP16, 128, [20], [90], 2, 1, page=7, causal=True)),
    ("fp32-window", lambda dev: run_varlen(dev, FP32, 64, [25], [25], 2, 2, window=(6, 1))),
    ("decode-append", lambda dev: run_kvcache(dev, BF16, 128, [40, 9], 1, 8, 2, page=16, append=True)),
]


@pytest.mark.parametrize("case", CROSS, ids=[c[0] for c in CROSS])
def test_cross_backend_agreement(gpu_backend, case):
    """CPU and CUDA kernels on identical inputs (same seed): each passes the reference check, and
    the two outputs agree to within the sum of their error bounds."""
    _, fn = case
    torch.manual_seed(123)
    o_cpu, lse_cpu = fn("cpu") if not gpu_backend.emulated else _on_cpu(fn)
    torch.manual_seed(123)
    o_gpu, lse_gpu = fn(gpu_backend.device)
    diff = (o_gpu.float().cpu() - o_cpu.float()).abs().max().item()
    assert diff <= 2 * 4 * _floor(o_cpu.dtype) + 0.05 * (o_cpu.dtype != FP32), f"cpu vs cuda: {diff:.3e}"
    fin = torch.isfinite(lse_cpu)
    assert torch.equal(fin, torch.isfinite(lse_gpu.cpu()))
    if fin.any():
        assert (lse_gpu.cpu()[fin] - lse_cpu[fin]).abs().max().item() < 2e-3


def _on_cpu(fn):
    """Run fn on the CPU kernels while the simt backend is active (it routes CPU tensors)."""
    from llmkern import _backend

    prev = getattr(_backend._state, "lib", None)
    _backend._state.lib = None
    try:
        return fn("cpu")
    finally:
        _backend._state.lib = prev


# ---- CUDA graphs: a whole decode step (append + attention) captured and replayed ---------------

@pytest.mark.cuda
@pytest.mark.parametrize("num_splits", [1, 3, 0])  # 0 = automatic (splits here: few CTAs, long caches)
def test_cuda_graph_decode_step(num_splits):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = "cuda"
    b, hq, hkv, D, bs, max_blocks = 4, 8, 2, 128, 16, 64
    nb = b * max_blocks + 4
    kc = torch.randn(nb, bs, hkv, D, device=dev).to(BF16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device=dev)[: b * max_blocks].view(b, max_blocks).int()
    q_s = torch.zeros(b, 1, hq, D, device=dev, dtype=BF16)
    k_s = torch.zeros(b, 1, hkv, D, device=dev, dtype=BF16)
    v_s = torch.zeros_like(k_s)
    lens_s = torch.tensor([5, 17, 700, 1000], dtype=torch.int32, device=dev)
    out_s = torch.empty_like(q_s)

    def step():
        llmkern.flash_attn_with_kvcache(q_s, kc, vc, k=k_s, v=v_s, cache_seqlens=lens_s,
                                        block_table=bt, causal=True, num_splits=num_splits, out=out_s)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph (kernel attributes, allocator)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for it in range(3):
        q_s.copy_(torch.randn(q_s.shape, device=dev))
        k_s.copy_(torch.randn(k_s.shape, device=dev))
        v_s.copy_(torch.randn(v_s.shape, device=dev))
        lens_s.add_(1 + it)
        kc0, vc0 = kc.clone(), vc.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref, _, kc_ref, vc_ref = ref_kvcache(q_s.cpu(), kc0.cpu(), vc0.cpu(), lens_s.cpu(), D ** -0.5,
                                             k=k_s.cpu(), v=v_s.cpu(), block_table=bt.cpu(), causal=True)
        same, _, _, _ = ref_kvcache(q_s.cpu(), kc0.cpu(), vc0.cpu(), lens_s.cpu(), D ** -0.5, k=k_s.cpu(),
                                    v=v_s.cpu(), block_table=bt.cpu(), causal=True, compute_dtype=BF16)
        assert_fa_close(out_s, ref, same, f"replay {it}")
        assert torch.equal(kc.cpu(), kc_ref) and torch.equal(vc.cpu(), vc_ref)


@pytest.mark.cuda
def test_cuda_kernels_compiled():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    assert "cuda" in llmkern.build_info()["backends"]
