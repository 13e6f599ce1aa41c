"""MoE kernels (topk_softmax, moe_align_block_size, fused_moe) on every backend (cpu; simt = the
CUDA kernels emulated; cuda) against plain-torch references written here: a per-token loop over the
chosen experts in fp64, and the same loop in the storage dtype for the tolerance (flash-attn's rule:
error <= 2 * the error of torch in that dtype + tiny). Bad inputs: tests/bad_inputs/moe.py."""
import os

import pytest
import torch
import torch.nn.functional as F

import llmkern
from llmkern.ops import moe as moe_ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ---- references -----------------------------------------------------------------------------

def ref_moe(x, w13, w2, weights, ids, expert_map=None, dtype=torch.float64):
    """sum_j w[t,j] * w2[e] (silu(gate_e x) * up_e x), token by token, in `dtype`."""
    T, H = x.shape
    I = w2.shape[2]
    out = torch.zeros(T, H, dtype=dtype)
    for t in range(T):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e >= 0 and expert_map is not None:
                e = int(expert_map[e])
            if e < 0:
                continue
            h = w13[e].to(dtype) @ x[t].to(dtype)
            a = F.silu(h[:I]) * h[I:]
            out[t] += float(weights[t, j]) * (w2[e].to(dtype) @ a.to(dtype))
    return out


def assert_moe_close(out, x, w13, w2, weights, ids, expert_map=None):
    ref = ref_moe(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu(), expert_map)
    err = (out.cpu().double() - ref).abs().max().item()
    if x.dtype == torch.float32:
        tol = 1e-5 * max(ref.abs().max().item(), 1.0)
    else:
        same = ref_moe(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu(), expert_map, dtype=x.dtype)
        tol = 2 * (same.double() - ref).abs().max().item() + 1e-3
    assert err <= tol, f"max error {err} > tolerance {tol}"


def make_moe(T, E, H, I, dtype, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    return x.to(dtype).to(dev), w13.to(dtype).to(dev), w2.to(dtype).to(dev)


def route(T, E, k, seed=0, skew=False):
    """Random distinct experts per token; skew: expert 0 in every row (a ragged load)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int()
    if skew:
        for t in range(T):
            if 0 not in ids[t]:
                ids[t, 0] = 0
    w = torch.rand(T, k, generator=g) + 0.1
    return w / w.sum(-1, keepdim=True), ids


# ---- topk_softmax -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,renorm", [(1, False), (2, True), (2, False), (8, True)])
def test_topk_softmax(backend, dtype, k, renorm):
    E = 8 if k < 8 else 60
    # distinct logits, exact in every dtype (torch.topk orders ties arbitrarily)
    g = torch.stack([(torch.randperm(E) - E / 2) / 8 for _ in range(13)]).to(dtype)
    w, ids = llmkern.topk_softmax(g.to(backend.device), k, renormalize=renorm)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == (13, k)
    p = torch.softmax(g.double(), -1)
    rw, rid = p.topk(k, -1)
    if renorm:
        rw = rw / rw.sum(-1, keepdim=True)
    assert torch.equal(ids.cpu().long(), rid)
    assert (w.cpu().double() - rw).abs().max().item() < 1e-5


def test_topk_softmax_ties_take_lower_id(backend):
    g = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    w, ids = llmkern.topk_softmax(g.to(backend.device), 3)
    assert ids.cpu().tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.allclose(w.cpu()[1], torch.full((3,), 0.2))


# ---- moe_align_block_size ---------------------------------------------------------------------

def ref_align(ids, E, B):
    flat = ids.reshape(-1).tolist()
    n = len(flat)
    sorted_ids, blocks = [], []
    for e in range(E):
        group = [i for i, v in enumerate(flat) if v == e]
        if not group:
            continue
        nb = -(-len(group) // B)
        sorted_ids += group + [n] * (nb * B - len(group))
        blocks += [e] * nb
    return sorted_ids, blocks


@pytest.mark.parametrize("T,E,k,B", [(9, 4, 2, 4), (40, 8, 2, 16), (5, 16, 8, 3), (1, 3, 1, 1)])
def test_moe_align_block_size(backend, T, E, k, B):
    _, ids = route(T, E, k, seed=T, skew=True)
    ids[0, 0] = -1  # an expert on another rank: left out
    s, b, n = llmkern.moe_align_block_size(ids.to(backend.device), E, B)
    rs, rb = ref_align(ids, E, B)
    assert int(n.item()) == len(rs)
    assert s.shape == (ids.numel() + E * (B - 1),) and b.shape == (-(-s.shape[0] // B),)
    assert s.cpu().tolist() == rs + [ids.numel()] * (s.shape[0] - len(rs))
    assert b.cpu().tolist() == rb + [-1] * (b.shape[0] - len(rb))


# ---- fused_moe --------------------------------------------------------------------------------

# (T, E, H, I, k): tile edges (H, I not multiples of 64 / 32 / 16), more rows than one tile per
# expert, top-k 1 / 2 / 8, an expert with no tokens (E > what the routing uses); odd H / I take the
# CUDA kernels' element-wise staging, the others their 16-byte cp.async staging.
SHAPES = [(5, 4, 40, 24, 2), (37, 4, 72, 40, 2), (6, 8, 24, 16, 8), (9, 3, 16, 8, 1), (4, 3, 33, 17, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,E,H,I,k", SHAPES)
def test_fused_moe(backend, dtype, T, E, H, I, k):
    x, w13, w2 = make_moe(T, E, H, I, dtype, backend.device)
    w, ids = route(T, E, k, seed=T + k, skew=True)
    out = llmkern.fused_moe(x, w13, w2, w.to(backend.device), ids.to(backend.device))
    assert out.dtype == dtype and out.shape == (T, H)
    assert_moe_close(out, x, w13, w2, w, ids)


def test_fused_moe_idle_expert_and_skipped_ids(backend):
    T, E, H, I = 7, 5, 32, 16
    x, w13, w2 = make_moe(T, E, H, I, torch.bfloat16, backend.device)
    w, ids = route(T, 4, 2, seed=3)          # expert 4 gets no token
    w13[4].fill_(float("nan"))               # ... and is never read
    ids[1, 0] = -1
    ids[4] = -1                              # a token with no local expert: zeros
    out = llmkern.fused_moe(x, w13, w2, w.to(backend.device), ids.to(backend.device))
    assert torch.equal(out[4].cpu(), torch.zeros(H, dtype=torch.bfloat16))
    assert_moe_close(out, x, w13, w2, w, ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_expert_map(backend, dtype):
    """Expert parallelism: rank-local w13/w2 rows 0..2 hold global experts 5, 1, 6."""
    T, H, I, k, E_global = 11, 40, 24, 2, 8
    x, w13, w2 = make_moe(T, 3, H, I, dtype, backend.device)
    emap = torch.full((E_global,), -1, dtype=torch.int32)
    emap[5], emap[1], emap[6] = 0, 1, 2
    w, ids = route(T, E_global, k, seed=5)
    out = llmkern.fused_moe(x, w13, w2, w.to(backend.device), ids.to(backend.device), expert_map=emap.to(backend.device))
    assert_moe_close(out, x, w13, w2, w, ids, expert_map=emap)


def test_fused_moe_out_and_in_place(backend):
    T, E, H, I = 6, 4, 32, 24
    x, w13, w2 = make_moe(T, E, H, I, torch.float32, backend.device)
    w, ids = route(T, E, 2, seed=1)
    w, ids = w.to(backend.device), ids.to(backend.device)
    ref = llmkern.fused_moe(x, w13, w2, w, ids)
    buf = torch.full((T, H), 7.0, device=backend.device)
    assert llmkern.fused_moe(x, w13, w2, w, ids, out=buf) is buf
    assert torch.equal(buf, ref)
    x2 = x.clone()
    llmkern.fused_moe(x2, w13, w2, w, ids.long(), out=x2)  # vLLM's inplace=True; int64 ids
    assert torch.equal(x2, ref)
    empty = llmkern.fused_moe(x[:0], w13, w2, w[:0], ids[:0])
    assert empty.shape == (0, H)


@pytest.mark.parametrize("dtype,pack", [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None),
                                        (torch.bfloat16, torch.float32)], ids=["fp32", "fp16", "bf16", "bf16-fp32-panels"])
def test_fused_moe_packed_cpu(dtype, pack):
    # skewed routing: expert 0 gets all 29 rows (the GEMMs' prefill shapes: AMX tiles from 4 rows),
    # the others a few (decode shapes)
    T, E, H, I, k = 29, 6, 72, 40, 2
    x, w13, w2 = make_moe(T, E, H, I, dtype, "cpu")
    w, ids = route(T, E, k, seed=2, skew=True)
    emap = torch.tensor([3, -1, 0, 1, 2, 4, 5], dtype=torch.int32)  # 7 global experts, one elsewhere
    ids[ids == 6] = 1
    packed = llmkern.pack_moe_weights(w13, w2, dtype=pack)
    if dtype == torch.bfloat16 and pack is None:  # bf16 panels in k pairs, gate/up interleaved
        assert packed.w13.dtype == torch.bfloat16
        assert packed.w13.shape == (E, 2 * -(-I // 16), H // 2, 16, 2) and packed.w2.shape == (E, -(-H // 16), I // 2, 16, 2)
        with pytest.raises(ValueError, match="hidden_states"):
            llmkern.fused_moe(x.float(), packed, None, w, ids, expert_map=emap)
    else:
        assert packed.w13.shape == (E, -(-2 * I // 16), H, 16) and packed.w13.dtype == torch.float32
    assert packed.intermediate_size == I
    out = llmkern.fused_moe(x, packed, None, w, ids, expert_map=emap)
    assert_moe_close(out, x, w13, w2, w, ids, expert_map=emap)


def on_emulated_tiles(body: str):
    """Runs `body` (Python, with torch, llmkern and this module's helpers imported) in a child
    process on the AMX tiles' software model."""
    from runtime_helpers import amx_model_or_skip, run_python

    amx_model_or_skip()
    code = (
        "import sys, torch, llmkern\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_moe_kernels import *\n"
        "assert llmkern.build_info()['cpu_amx'] == 'emulated'\n"
    )
    run_python(code + body, timeout=300, LLMKERN_CPU_ISA="amx-emulated")


def test_fused_moe_bf16_packed_on_amx_tiles_emulated():
    """The bf16 experts' GEMMs on the AMX tiles' software model (the expert with all rows), odd H and I."""
    on_emulated_tiles(
        "for T, E, H, I in [(29, 6, 72, 40), (40, 3, 33, 17)]:\n"
        "    x, w13, w2 = make_moe(T, E, H, I, torch.bfloat16, 'cpu')\n"
        "    w, ids = route(T, E, 2, seed=2, skew=True)\n"
        "    out = llmkern.fused_moe(x, llmkern.pack_moe_weights(w13, w2), None, w, ids)\n"
        "    assert_moe_close(out, x, w13, w2, w, ids)\n"
    )


# bf16 experts as stored, hidden and intermediate multiples of 32: on a CPU with AMX the tiles read
# the weight rows in place (moe_amx_cpu.h). (T, E, H, I, k, skew): experts of 1-3 rows, of more
# than one 32-row block with a partial last tile, and of exactly 16 rows.
PLAIN_AMX_SHAPES = [(7, 4, 64, 96, 2, False), (70, 3, 32, 64, 2, True), (16, 2, 96, 32, 1, False)]
# Every expert with >= 4 rows (the packed GEMM's AMX threshold), so both paths run on tiles.
PACKED_TWIN_SHAPES = [(40, 4, 64, 96, 2, False), (70, 3, 32, 64, 2, True)]


def _moe_case(T, E, H, I, k, skew):
    x, w13, w2 = make_moe(T, E, H, I, torch.bfloat16, "cpu", seed=T)
    w, ids = route(T, E, k, seed=T + 1, skew=skew)
    return x, w13, w2, w, ids


def check_plain_bf16_moe_on_tiles():
    """Plain bf16 experts against fp64, and bit for bit against the packed experts where both
    run on tiles (the same sums in the same order)."""
    for case in PLAIN_AMX_SHAPES:
        x, w13, w2, w, ids = _moe_case(*case)
        assert_moe_close(llmkern.fused_moe(x, w13, w2, w, ids), x, w13, w2, w, ids)
    for case in PACKED_TWIN_SHAPES:
        x, w13, w2, w, ids = _moe_case(*case)
        counts = torch.bincount(ids.flatten().long(), minlength=case[1])
        assert int(counts.min()) >= 4, counts
        plain = llmkern.fused_moe(x, w13, w2, w, ids)
        packed = llmkern.fused_moe(x, llmkern.pack_moe_weights(w13, w2), None, w, ids)
        assert torch.equal(plain, packed), (plain.float() - packed.float()).abs().max()


def test_fused_moe_bf16_plain_on_amx_tiles():
    if llmkern.build_info().get("cpu_amx") != "hardware":
        pytest.skip("this CPU has no AMX tiles (the emulated run is the next test)")
    check_plain_bf16_moe_on_tiles()


def test_fused_moe_bf16_plain_on_amx_tiles_emulated():
    on_emulated_tiles("check_plain_bf16_moe_on_tiles()\n")


# bf16 experts as stored where no AMX tiles run them: units of weight rows transposed into k pairs
# as they are read, on the packed GEMM's tiles (moe_bf16_cpu.h). (T, E, H, I, k, skew): decode experts
# of 1-3 rows, experts of several row blocks, odd sizes (an odd k, part-filled panels, a last unit of
# one panel), and wide decode rows (many 64-pair chunks, a last one part-filled; the next unit's
# prefetch).
PLAIN_SHAPES = [(7, 4, 64, 96, 2, False), (70, 3, 32, 64, 2, True), (29, 6, 72, 40, 2, True),
                (40, 3, 33, 17, 2, True), (2, 8, 1024, 352, 2, False)]


def check_plain_bf16_moe_same_bits_as_packed():
    assert llmkern.build_info()["cpu_amx"] == "off"
    for case in PLAIN_SHAPES:
        x, w13, w2, w, ids = _moe_case(*case)
        plain = llmkern.fused_moe(x, w13, w2, w, ids)
        assert_moe_close(plain, x, w13, w2, w, ids)
        packed = llmkern.fused_moe(x, llmkern.pack_moe_weights(w13, w2), None, w, ids)
        assert torch.equal(plain, packed), (case, (plain.float() - packed.float()).abs().max())


@pytest.mark.parametrize("isa,dot", [("avx512", "1"), ("avx512", "0"), ("avx2", "0"), ("scalar", "0")],
                         ids=["avx512", "avx512-widened", "avx2", "scalar"])
def test_fused_moe_bf16_plain_same_bits_as_packed(isa, dot):
    """Plain bf16 experts against fp64, and bit for bit against the packed experts, on each level
    below AMX (vdpbf16ps where the CPU has AVX512_BF16, else widened to fp32)."""
    from runtime_helpers import run_python

    order = ["scalar", "avx2", "avx512"]
    supported = llmkern.build_info()["cpu_simd_supported"]
    if supported != "amx" and order.index(isa) > order.index(supported):
        pytest.skip(f"this CPU's level is {supported}")
    code = (
        "import sys, torch, llmkern\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_moe_kernels import *\n"
        "check_plain_bf16_moe_same_bits_as_packed()\n"
    )
    run_python(code, timeout=300, LLMKERN_CPU_ISA=isa, LLMKERN_LINEAR_BF16_DOT=dot)


def test_opcheck_and_compile():
    T, E, H, I = 5, 4, 32, 24
    x, w13, w2 = make_moe(T, E, H, I, torch.float32, "cpu")
    g = torch.randn(T, E)
    w, ids = route(T, E, 2)
    torch.library.opcheck(moe_ops.topk_softmax.op, (g, 2, True))
    torch.library.opcheck(moe_ops.moe_align_block_size.op, (ids, E, 4))
    torch.library.opcheck(moe_ops._fused_moe_out.op, (torch.empty(T, H), x, w13, w2, w, ids, None))
    p = llmkern.pack_moe_weights(w13, w2)
    torch.library.opcheck(moe_ops._fused_moe_packed_out.op, (torch.empty(T, H), x, p.w13, p.w2, I, w, ids, None))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def block(x, g):
        tw, ti = llmkern.topk_softmax(g, 2, renormalize=True)
        return llmkern.fused_moe(x, w13, w2, tw, ti) + llmkern.fused_moe(x, p, None, tw, ti)

    tw, ti = llmkern.topk_softmax(g, 2, renormalize=True)
    ref = ref_moe(x, w13, w2, tw, ti)
    assert (block(x, g).double() - 2 * ref).abs().max().item() < 1e-4


def test_vllm_compat_names(backend):
    """compat.vllm_ops: vLLM's in-place topk_softmax / moe_align_block_size and fused_experts."""
    from llmkern.compat import vllm_ops as ops

    dev = backend.device
    T, E, H, I, k, B = 6, 4, 32, 24, 2, 4
    g = torch.stack([(torch.randperm(E) - E / 2) / 4 for _ in range(T)])
    w = torch.empty(T, k, device=dev)
    ids = torch.empty(T, k, dtype=torch.int32, device=dev)
    src = torch.empty(T, k, dtype=torch.int32, device=dev)
    ops.topk_softmax(w, ids, src, g.to(dev), True)
    rw, rid = torch.softmax(g.double(), -1).topk(k, -1)
    assert torch.equal(ids.cpu().long(), rid)
    assert torch.allclose(w.cpu().double(), rw / rw.sum(-1, keepdim=True), atol=1e-6)
    assert src.cpu().tolist() == [[t, t + T] for t in range(T)]
    n_sorted = T * k + E * (B - 1) + 5  # vLLM's buffers may be longer than needed
    s = torch.empty(n_sorted, dtype=torch.int32, device=dev)
    blocks = torch.empty(-(-n_sorted // B), dtype=torch.int32, device=dev)
    npad = torch.empty(1, dtype=torch.int32, device=dev)
    ops.moe_align_block_size(ids, E, B, s, blocks, npad)
    rs, rb = ref_align(ids.cpu(), E, B)
    assert int(npad.item()) == len(rs) and s.cpu().tolist()[:len(rs)] == rs and blocks.cpu().tolist()[:len(rb)] == rb
    x, w13, w2 = make_moe(T, E, H, I, torch.float32, dev)
    assert_moe_close(ops.fused_experts(x, w13, w2, w, ids), x, w13, w2, w.cpu(), ids.cpu())
