"""The SIMT portability layer (csrc/common/simt*.h; its emulator in csrc/simt/): its self-test
kernels run on the emulator (llmkern._simt) and, when a GPU is present, natively (llmkern._C).
Expected values are derived here from the CUDA programming guide and the PTX ISA (shuffle, ballot,
ldmatrix and mma fragment layouts), independently of the emulator's code."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
import torch

np = pytest.importorskip("numpy", reason="these layer checks build their fragments with numpy (not guaranteed on the GPU check machine)")

import llmkern
from llmkern._backend import dl

FULL = 0xFFFFFFFF


@dataclass
class Layer:
    mod: object
    device: str

    @property
    def emulated(self) -> bool:
        return self.device == "cpu"

    def __call__(self, name, *args):
        conv = [dl(a) if isinstance(a, torch.Tensor) else a for a in args]
        stream = torch.cuda.current_stream().cuda_stream if self.device == "cuda" else 0
        getattr(self.mod, "simt_selftest_" + name)(*conv, stream)
        if self.device == "cuda":
            torch.cuda.synchronize()


def _simt_module():
    if not llmkern.simt_available():
        if os.environ.get("LLMKERN_REQUIRE_SIMT") == "1":
            pytest.fail("llmkern._simt is not built (install with LLMKERN_SIMT=ON)")
        pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
    import llmkern._simt as m

    return m


@pytest.fixture(params=["simt", pytest.param("cuda", marks=pytest.mark.cuda)])
def layer(request):
    if request.param == "simt":
        return Layer(_simt_module(), "cpu")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if not hasattr(llmkern._C, "simt_selftest_warp"):
        pytest.fail("a GPU is present but llmkern was built without CUDA")
    return Layer(llmkern._C, "cuda")


@pytest.fixture
def emu():
    return Layer(_simt_module(), "cpu")


def _i32(x) -> int:
    return int(np.array(x & 0xFFFFFFFF, dtype=np.uint32).view(np.int32))


# ---------------------------------------------------------------------------------------------
# Warp shuffles, ballot, any/all (CUDA C++ Programming Guide, "Warp Shuffle Functions")
# ---------------------------------------------------------------------------------------------


def _shfl_source(op, lane, operand, width):
    """Source lane of `lane`, per the programming guide's description of each shuffle."""
    base, pos = lane - lane % width, lane % width
    if op == "idx":  # srcLane outside [0, width) wraps modulo width, within the lane's segment
        return base + operand % width
    if op == "up":  # lanes whose source would fall below the segment keep their value
        return lane - operand if pos >= operand else lane
    if op == "down":  # ... or beyond its end
        return lane + operand if pos + operand < width else lane
    # xor: a source in an earlier segment is read, one in a later segment returns the own value
    src = lane ^ operand
    return lane if src // width > lane // width else src


def _shfl_cases():
    cases = []
    for width in (32, 16, 8, 4, 2, 1):
        cases += [("idx", s, width) for s in (0, 3, 7, 31, -1, 35, width - 1, width)]
        cases += [(op, d, width) for op in ("up", "down") for d in (0, 1, 2, 5, 16, 31)]
        cases += [("xor", m, width) for m in (1, 2, 5, 16, 31, 17)]
    return cases


def test_shuffles(layer):
    n = 64
    vals = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int64).to(torch.int32)
    cases = _shfl_cases()
    code = {"idx": 0, "up": 1, "down": 2, "xor": 3}
    ops = torch.tensor([[code[op], arg, w] for op, arg, w in cases], dtype=torch.int32)
    out = torch.full((len(cases), n), 7, dtype=torch.int32)
    layer("warp", vals.to(layer.device), ops.to(layer.device), out := out.to(layer.device))
    got, v = out.cpu().numpy(), vals.numpy()
    for i, (op, arg, width) in enumerate(cases):
        for t in range(n):
            warp, lane = divmod(t, 32)
            src = warp * 32 + _shfl_source(op, lane, arg, width)
            assert got[i, t] == v[src], (op, arg, width, t)


def test_ballot_any_all_activemask(layer):
    n = 64
    vals = torch.randint(0, 2**20, (n,), dtype=torch.int32)
    vals[32:] |= 1 << 4  # warp 1: bit 4 set everywhere -> all() true there
    vals[:32] &= ~(1 << 5)  # warp 0: bit 5 clear everywhere -> any() false there
    bits = [0, 1, 4, 5]
    partial = [0x0000FFFF, 0x0F0F0F0F, 0xFFFF0000]
    rows = [[4, b, 32] for b in bits] + [[5, b, 32] for b in bits] + [[6, b, 32] for b in bits]
    rows += [[7, _i32(m), 32] for m in partial] + [[8, _i32(m), 32] for m in partial] + [[9, 0, 32]]
    ops = torch.tensor(rows, dtype=torch.int32)
    out = torch.zeros(len(rows), n, dtype=torch.int32, device=layer.device)
    layer("warp", vals.to(layer.device), ops.to(layer.device), out)
    got, v = out.cpu().numpy(), vals.numpy().astype(np.int64)
    for i, (op, arg, _) in enumerate(rows):
        for t in range(n):
            w, lane = divmod(t, 32)
            warp_vals = v[32 * w : 32 * w + 32]
            if op in (4, 5, 6):
                pred = (warp_vals >> arg) & 1
                ballot = sum(int(p) << k for k, p in enumerate(pred))
                want = {4: _i32(ballot), 5: int(pred.any()), 6: int(pred.all())}[op]
            elif op in (7, 8):
                mask = arg & FULL
                if not mask >> lane & 1:
                    want = -1
                elif op == 7:
                    want = warp_vals[lane ^ 1]
                else:
                    want = _i32(sum(1 << k for k in range(32) if mask >> k & 1 and warp_vals[k] & 1))
            else:
                want = -1  # converged warp: all 32 lanes active
            assert got[i, t] == want, (op, arg, t)


# ---------------------------------------------------------------------------------------------
# Barriers, indices, block reductions and scans, atomics, dynamic shared memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block,grid", [((64, 1, 1), (2, 1)), ((8, 4, 2), (1, 3)), ((32, 3, 1), (2, 2)), ((48, 1, 1), (1, 1))])
def test_barrier_counting_and_indices(layer, block, grid):
    bx, by, bz = block
    gx, gy = grid
    nt, nb = bx * by * bz, gx * gy
    out = torch.full((nb, nt, 10), -5, dtype=torch.int32, device=layer.device)
    layer("barrier", out, bx, by, bz, gx, gy)
    o = out.cpu().numpy()
    for b in range(nb):
        for t in range(nt):
            x, y, z = t % bx, (t // bx) % by, t // (bx * by)
            assert list(o[b, t, :6]) == [x, y, z, b, t % 32, t // 32]
    assert (o[..., 6] == nt).all()  # every thread's increment is visible after the barrier
    assert (o[..., 7] == 3 * nt).all()
    assert (o[..., 8] == len(range(0, nt, 3))).all()  # __syncthreads_count
    assert (o[..., 9] == 3).all()  # __syncthreads_or / _and


@pytest.mark.parametrize("n", [32, 96, 256, 1024])
def test_block_reduce_and_scan(layer, n):
    rows = 3
    x = torch.randn(rows, n)
    x[1, n // 2] = 50.0  # a clear maximum
    xi = torch.randint(-1000, 1000, (rows, n), dtype=torch.int32)
    out = torch.zeros(rows, n, 5, device=layer.device)
    outi = torch.zeros(rows, n, 2, dtype=torch.int32, device=layer.device)
    layer("block", x.to(layer.device), out, xi.to(layer.device), outi)
    o, oi = out.cpu().double(), outi.cpu()
    xd = x.double()
    incl = xd.cumsum(1)
    tol = dict(rtol=0, atol=1e-4 * n**0.5 * 4)
    torch.testing.assert_close(o[..., 0], xd.sum(1, keepdim=True).expand(rows, n), **tol)
    assert torch.equal(o[..., 1].float(), x.max(1, keepdim=True).values.expand(rows, n))
    torch.testing.assert_close(o[..., 2], incl, **tol)
    torch.testing.assert_close(o[..., 3], incl - xd, **tol)
    torch.testing.assert_close(o[..., 4], xd.sum(1, keepdim=True).expand(rows, n), **tol)
    # every thread receives bit-identical broadcasts
    assert (o[..., 0] == o[:, :1, 0]).all() and (o[..., 4] == o[:, :1, 4]).all()
    assert torch.equal(oi[..., 0], xi.sum(1, keepdim=True, dtype=torch.int32).expand(rows, n))
    assert torch.equal(oi[..., 1], xi.cumsum(1, dtype=torch.int32))


def test_atomics(layer):
    blocks, threads = 7, 96
    n = blocks * threads
    gid = np.arange(n)
    ic = torch.tensor([0, 0, -1, 10**6, 0, -1, 0, 0], dtype=torch.int32, device=layer.device)
    uc = torch.zeros(2, dtype=torch.int32, device=layer.device)
    ull = torch.zeros(1, dtype=torch.int64, device=layer.device)
    f = torch.zeros(1, device=layer.device)
    layer("atomics", ic, uc, ull, f, blocks, threads)
    ic, uc = ic.cpu().tolist(), uc.cpu().tolist()
    assert ic[0] == n and ic[1] == gid.sum() and ic[4] == 3 * n
    assert ic[2] == ((gid * 37) % 1000).max() and ic[3] == (5000 - (gid * 37) % 1000).min()
    assert 0 <= ic[5] < n
    assert uc == [3 * n, 2 * (n - 1)]
    assert ull.item() == n << 33 and f.item() == 0.5 * n


def test_dynamic_smem(layer):
    # Over 48 KiB needs the opt-in (llmk::simt::set_max_dynamic_smem) first, on a GPU and in the
    # emulator alike; the opt-in lasts for the process, so the failing launch comes first.
    with pytest.raises(RuntimeError, match="set_max_dynamic_smem" if layer.emulated else ""):
        layer("dynamic_smem", torch.zeros(20001, dtype=torch.int32, device=layer.device), 80004, False)
    for n, opt_in in [(1000, False), (20000, True), (20000, False)]:
        out = torch.zeros(n + 1, dtype=torch.int32, device=layer.device)
        layer("dynamic_smem", out, 4 * n + 4, opt_in)
        o = out.cpu()
        assert torch.equal(o[:n], (3 * torch.arange(n, dtype=torch.int32) + 1).flip(0)) and o[n] == 1


# ---------------------------------------------------------------------------------------------
# cp.async: zero-fill past src_bytes, visibility after wait_group + __syncthreads
# ---------------------------------------------------------------------------------------------


def test_cp_async_zero_fill_and_groups(layer):
    rows = 64
    src = torch.randint(-(2**31), 2**31 - 1, (rows, 4), dtype=torch.int64).to(torch.int32)
    nbytes = torch.tensor([(0, 1, 3, 4, 7, 8, 12, 15, 16)[i % 9] for i in range(rows)], dtype=torch.int32)
    out = torch.zeros(2, rows, 4, dtype=torch.int32, device=layer.device)
    layer("cp_async", src.to(layer.device), nbytes.to(layer.device), out)
    o = out.cpu()
    s8 = src.view(torch.uint8).view(rows, 16)
    stage0 = torch.zeros(rows, 16, dtype=torch.uint8)
    for r in range(rows):
        stage0[r, : nbytes[r]] = s8[r, : nbytes[r]]
    idx = torch.arange(rows)
    assert torch.equal(o[0].view(torch.uint8).view(rows, 16), stage0[(idx + 5) % rows])
    assert torch.equal(o[1], src[(idx + 4) % rows])


# ---------------------------------------------------------------------------------------------
# ldmatrix and mma.m16n8k16 (PTX ISA: "Warp-level matrix load instruction: ldmatrix" and
# "Matrix Fragments for mma.m16n8k16 with floating point type")
# ---------------------------------------------------------------------------------------------


def test_ldmatrix_layouts(layer):
    rows = torch.randint(-(2**15), 2**15 - 1, (32, 8), dtype=torch.int32).to(torch.int16)
    perm = torch.randperm(32).to(torch.int32)  # lane l supplies the address of shared row perm[l]
    out = torch.zeros(6, 32, 4, dtype=torch.int32, device=layer.device)
    layer("ldmatrix", rows.to(layer.device), perm.to(layer.device), out)
    got = out.cpu().numpy().view(np.uint32)
    r16, p = rows.numpy().view(np.uint16).astype(np.uint32), perm.numpy()
    for v, (num, trans) in enumerate([(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]):
        for lane in range(32):
            for j in range(4):
                if j >= num:
                    want = 0
                else:
                    # matrix j: rows given by the addresses of lanes 8j..8j+7
                    m = r16[p[8 * j : 8 * j + 8]]
                    r, c = lane // 4, 2 * (lane % 4)
                    lo, hi = (m[c, r], m[c + 1, r]) if trans else (m[r, c], m[r, c + 1])
                    want = lo | (hi << 16)
                assert got[v, lane, j] == want, (num, trans, lane, j)


def _to_bits(x: torch.Tensor, dtype) -> np.ndarray:
    return x.to(dtype).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mma_fragments(layer, dtype):
    a = torch.randn(16, 16).to(dtype)
    b = torch.randn(16, 8).to(dtype)
    c = torch.randn(16, 8)
    ab, bb = _to_bits(a, dtype), _to_bits(b, dtype)
    af = np.zeros((32, 4), np.uint32)
    bf = np.zeros((32, 2), np.uint32)
    cf = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):  # A: a0..a7, two per register, low half first
            row = g if (i < 2 or 4 <= i < 6) else g + 8
            col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
            af[lane, i // 2] |= ab[row, col] << (16 * (i % 2))
        for i in range(4):  # B: b0..b3
            row = t * 2 + (i & 1) + (8 if i >= 2 else 0)
            bf[lane, i // 2] |= bb[row, g] << (16 * (i % 2))
        for i in range(4):  # C/D: c0..c3
            cf[lane, i] = c[g if i < 2 else g + 8, t * 2 + (i & 1)]
    d = torch.zeros(32, 4, device=layer.device)
    dev = layer.device
    layer("mma", torch.from_numpy(af.view(np.int32)).to(dev), torch.from_numpy(bf.view(np.int32)).to(dev),
          torch.from_numpy(cf).to(dev), d, dtype == torch.float16)
    d = d.cpu()
    got = torch.zeros(16, 8)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(4):
            got[g if i < 2 else g + 8, t * 2 + (i & 1)] = d[lane, i]
    ref = a.double() @ b.double() + c.double()
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ldmatrix_mma_pipeline(layer, dtype):
    a = torch.randn(16, 16).to(dtype)
    b = torch.randn(16, 8).to(dtype)
    out = torch.zeros(16, 8, device=layer.device)
    dev = layer.device
    layer("ldmatrix_mma", a.view(torch.int16).to(dev), b.view(torch.int16).to(dev), out, dtype == torch.float16)
    torch.testing.assert_close(out.cpu().double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# fp16 / bf16 conversions (round to nearest even) and math intrinsics
# ---------------------------------------------------------------------------------------------


def _conversion_inputs() -> torch.Tensor:
    edge = [
        0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 65536.0, -65520.0, 1e6, 6.103515625e-05,
        6.097555e-05, 5.960464477539063e-08, 2.9802322387695312e-08, 2.98024e-08, 8.940697e-08,
        1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.3895313892515355e38,
        3.4e38, float("inf"), float("-inf"), float("nan"), 1e-30, 2048.0 + 1.0, 2048.0 + 3.0,
    ]
    x = torch.cat([torch.tensor(edge), torch.randn(300) * 100, torch.randn(300) * 1e-5,
                   (torch.rand(300) * 80 - 40).exp2()])
    return x[: x.numel() // 2 * 2].float()


def test_half_bf16_rounding_matches_torch(layer):
    x = _conversion_inputs()
    n = x.numel()
    dev = layer.device
    h = torch.zeros(n, dtype=torch.int16, device=dev)
    bf = torch.zeros(n, dtype=torch.int16, device=dev)
    back = torch.zeros(2, n, device=dev)
    pairs = torch.zeros(n, dtype=torch.int32, device=dev)
    math = torch.zeros(8, n, device=dev)
    layer("convert", x.to(dev), h, bf, back, pairs, math)
    h, bf, back, pairs, math = h.cpu(), bf.cpu(), back.cpu(), pairs.cpu(), math.cpu()
    nan = x.isnan()
    for got, dtype in ((h, torch.float16), (bf, torch.bfloat16)):
        ref = x.to(dtype)
        assert torch.equal(got[~nan], ref.view(torch.int16)[~nan])
        assert got.view(dtype)[nan].isnan().all()
    torch.testing.assert_close(back[0], x.to(torch.float16).float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(back[1], x.to(torch.bfloat16).float(), rtol=0, atol=0, equal_nan=True)
    # each int32 of `pairs` holds (low, high) halves: as int16 pairs on a little-endian host
    packed = pairs.view(torch.int16).view(2, n // 2, 2)
    ok = ~nan.view(n // 2, 2)
    for k, dtype in ((0, torch.float16), (1, torch.bfloat16)):
        assert torch.equal(packed[k][ok], x.to(dtype).view(torch.int16).view(n // 2, 2)[ok])
    finite = x.abs() < 1e4  # math checks in a range where fp32 results stay finite
    xd = x.double()
    a = xd.abs() + 0.5
    refs = [xd.clamp(max=10).exp(), xd.clamp(-10, 10).exp2(), a.log(), a.rsqrt(), xd / a, xd.tanh(),
            xd * a + 1, -xd + a.sqrt()]
    for k, ref in enumerate(refs):
        rtol = 1e-3 if (k == 5 and not layer.emulated) else 2e-5
        torch.testing.assert_close(math[k][finite].double(), ref[finite], rtol=rtol, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The emulator itself: planted bugs are reported, never hang; results are deterministic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,pattern", [
    (0, r"divergent barrier: thread 16 reached __syncthreads\(\) at simt/simt_selftest.cu:\d+ while threads 0-15 wait"),
    (1, r"deadlock: __syncthreads\(\) at simt/simt_selftest.cu:\d+ reached by 16 of 64 threads \(0-15\); threads 16-63 exited"),
    (2, r"deadlock: __syncthreads\(\) at simt/simt_selftest.cu:\d+ reached by 32 of 64 threads \(16-31, 48-63\); "
        r"threads 0-15, 32-47 wait in __shfl_xor_sync\(mask=0xffffffff\) simt/simt_selftest.cu:\d+ \| "
        r"__shfl_xor_sync\(mask=0xffffffff\) at simt/simt_selftest.cu:\d+ in warp 0 reached by lanes 0-15; "
        r"lanes 16-31 wait at __syncthreads\(\)"),
    (3, r"lane 16 is not in mask 0x0000ffff"),
    (4, r"mismatched warp collective"),
    (5, r"width 12 is not a power of two"),
    (6, r"cp_async_16 .*16-byte aligned"),
    (7, r"__shfl_xor_sync at simt/simt_selftest.cu:\d+: lane 0 of warp 0 reads lane 16, which has exited"),
])
def test_planted_bugs_raise(emu, kind, pattern):
    with pytest.raises(RuntimeError, match=r"simt: kernel fault_kernel, block \(0,0,0\): .*" + pattern):
        emu("fault", kind)
    test_barrier_counting_and_indices(emu, (64, 1, 1), (2, 1))  # the emulator is usable afterwards


def test_deterministic_and_speed(emu):
    x = torch.randn(4, 512)
    xi = torch.randint(-9, 9, (4, 512), dtype=torch.int32)
    outs = []
    for _ in range(2):
        out, outi = torch.zeros(4, 512, 5), torch.zeros(4, 512, 2, dtype=torch.int32)
        emu("block", x, out, xi, outi)
        f = torch.zeros(1)
        emu("atomics", torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int64), f, 3, 64)
        outs.append((out, f))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    before = emu.mod.simt_stats()
    t0 = time.perf_counter()
    emu("spin", 300, 256)
    dt = time.perf_counter() - t0
    after = emu.mod.simt_stats()
    switches = after["switches"] - before["switches"]
    assert after["barriers"] - before["barriers"] == 300 * 256 and switches >= 300 * 256
    print(f"simt emulator: {switches / dt / 1e6:.1f} M fiber switches/s (barrier + shuffle loop)")
