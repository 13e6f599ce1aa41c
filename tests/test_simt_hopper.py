"""The Hopper part of the SIMT layer (csrc/common/simt_hopper.h): wgmma, TMA tensor loads and
mbarriers, run by their self-test kernels on the emulator (llmkern._simt) and, on an sm_90 GPU
with a build for 90a, natively. Expectations come from the PTX ISA (wgmma fragment layouts, the
swizzle patterns, mbarrier phase semantics) and plain torch matmuls, not from the emulator."""
from __future__ import annotations

import os

import pytest
import torch

import llmkern
from llmkern._backend import dl


class Layer:
    def __init__(self, mod, device):
        self.mod, self.device = mod, device

    def __call__(self, name, *args):
        conv = [dl(a) if isinstance(a, torch.Tensor) else a for a in args]
        stream = torch.cuda.current_stream().cuda_stream if self.device == "cuda" else 0
        getattr(self.mod, "simt_selftest_" + name)(*conv, stream)
        if self.device == "cuda":
            torch.cuda.synchronize()


@pytest.fixture(params=["simt", pytest.param("cuda", marks=pytest.mark.cuda)])
def layer(request):
    if request.param == "simt":
        if not llmkern.simt_available():
            if os.environ.get("LLMKERN_REQUIRE_SIMT") == "1":
                pytest.fail("llmkern._simt is not built (install with LLMKERN_SIMT=ON)")
            pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
        import llmkern._simt as m

        return Layer(m, "cpu")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    if "90a" not in llmkern._C.build_info().get("cuda_archs", ""):
        pytest.skip("llmkern was not compiled for 90a")
    return Layer(llmkern._C, "cuda")


def _bits(x):
    return x.view(torch.int16)


def _frag_index(n):
    """(row, col) of accumulator element [thread, 4 i + e] of wgmma m64nNk16 (PTX ISA layout)."""
    t = torch.arange(128).view(128, 1, 1)
    i = torch.arange(n // 8).view(1, -1, 1)
    e = torch.arange(4).view(1, 1, 4)
    row = 16 * (t // 32) + (t % 32) // 4 + 8 * (e // 2)
    col = 8 * i + 2 * (t % 4) + e % 2
    return row.expand(128, n // 8, 4).reshape(128, -1), col.expand(128, n // 8, 4).reshape(128, -1)


def _a_fragments(a_bits):
    """A [64, 64] as register fragments of four k16 steps: [4, 128, 4] int32 (low half first)."""
    out = torch.zeros(4, 128, 4, dtype=torch.int64)
    u = a_bits.to(torch.int64) & 0xFFFF
    for kk in range(4):
        for t in range(128):
            w, g, q = t // 32, (t % 32) // 4, t % 4
            for i in range(8):
                row = 16 * w + g + 8 * ((i >> 1) & 1)
                col = 16 * kk + 2 * q + (i & 1) + 8 * (i >> 2)
                out[kk, t, i // 2] |= int(u[row, col]) << (16 * (i % 2))
    out[out >= 2**31] -= 2**32
    return out.to(torch.int32)


@pytest.mark.parametrize("swizzle", [128, 64, 32, 0])
@pytest.mark.parametrize("n,trans_b,use_regs,dtype", [
    (128, False, False, torch.bfloat16),   # S = Q K^T
    (128, True, True, torch.bfloat16),     # O += P V
    (64, True, False, torch.float16),
    (64, False, True, torch.float16),
])
def test_wgmma_layouts(layer, swizzle, n, trans_b, use_regs, dtype):
    g = torch.Generator().manual_seed(swizzle + n)
    a = torch.randn(64, 64, generator=g).to(dtype)
    b = torch.randn(64, n, generator=g).to(dtype)  # K x N
    c = torch.randn(64, n, generator=g)
    rows, cols = _frag_index(n)
    cf = c[rows, cols].contiguous()
    b_store = b.contiguous() if trans_b else b.t().contiguous()
    a_regs = _a_fragments(_bits(a)) if use_regs else torch.zeros(4, 128, 4, dtype=torch.int32)
    d = torch.full((128, n // 2), float("nan"))
    dev = layer.device
    d = d.to(dev)
    layer("wgmma", _bits(a).contiguous().to(dev), _bits(b_store).to(dev), a_regs.to(dev), cf.to(dev), d, n,
          trans_b, use_regs, swizzle, dtype == torch.float16)
    got = torch.zeros(64, n, dtype=torch.float64)
    got[rows, cols] = d.cpu().double()
    ref = a.double() @ b.double() + c.double()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)


def _swizzled(lin: torch.Tensor, swizzle: int) -> torch.Tensor:
    """Where TMA puts the 16-byte chunks of a box (CUDA programming guide, TMA swizzle): chunk bits
    4.. of the shared-memory address XOR address bits 7.. (1, 2 or 3 bits for 32/64/128 B)."""
    if not swizzle:
        return lin
    mask = {32: 1, 64: 3, 128: 7}[swizzle]
    chunks = lin.view(-1, 8)  # 8 int16 = 16 bytes
    out = torch.empty_like(chunks)
    for c in range(chunks.shape[0]):
        a = c * 16
        out[(a ^ (((a >> 7) & mask) << 4)) // 16] = chunks[c]
    return out.view(-1)


@pytest.mark.parametrize("shape,coords,box,swizzle", [
    ((40, 96), [0, 0], [64, 16], 128),
    ((40, 96), [64, 32], [64, 16], 128),          # past both ends: zero fill
    ((5, 33, 48), [-8, 30, 3], [32, 8, 3], 64),   # negative start, 3-d
    ((7, 24), [8, -3], [16, 8], 32),
    ((6, 40, 24), [8, 2, 1], [8, 16, 4], 0),
])
def test_tma_box(layer, shape, coords, box, swizzle):
    src = torch.randint(-30000, 30000, shape, dtype=torch.int16)
    n = 1
    for b in box:
        n *= b
    out = torch.zeros(n, dtype=torch.int16).to(layer.device)
    layer("tma", src.to(layer.device), coords, box, swizzle, out)
    # The box in row-major order (innermost dim last in torch), zero outside the tensor.
    padded = torch.zeros(tuple(reversed(box)), dtype=torch.int16)
    idx = [torch.arange(c, c + b) for c, b in zip(reversed(coords), reversed(box))]
    dims = list(shape)
    ok = [(ix >= 0) & (ix < d) for ix, d in zip(idx, dims)]
    sel = [ix[m] for ix, m in zip(idx, ok)]
    dst = [torch.nonzero(m).flatten() for m in ok]
    if all(len(s) for s in sel):
        padded[torch.meshgrid(*dst, indexing="ij")] = src[torch.meshgrid(*sel, indexing="ij")]
    torch.testing.assert_close(out.cpu(), _swizzled(padded.flatten(), swizzle), rtol=0, atol=0)


def test_mbarrier_phases_and_ring(layer):
    rounds = 7
    src = torch.randint(-30000, 30000, (16 * rounds, 32), dtype=torch.int16)
    out = torch.full((rounds, 64), -1, dtype=torch.int32).to(layer.device)
    probe = torch.full((8,), -1, dtype=torch.int32).to(layer.device)
    layer("mbarrier", src.to(layer.device), rounds, out, probe)
    # try_wait.parity(P) is true once the phase of parity P has completed: a phase needs all of its
    # arrivals and all of its expected transaction bytes.
    tile0 = src[:16].flatten().view(torch.int32)
    assert probe.cpu().tolist() == [0, 0, 0, 1, 0, 1, 0, int(tile0[3])]
    want = torch.stack([src[16 * r:16 * (r + 1)].flatten().view(torch.int32)[0:256:4] for r in range(rounds)])
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("kind,message", [
    (0, r"wgmma at .* never waited for \(missing wgmma_wait\)"),
    (1, r"deadlock: .*mbar_wait"),
    (2, r"TMA load at .* never landed"),
    (3, r"deadlock: .*wgmma \(warpgroup-wide\)"),
])
def test_emulator_reports_broken_protocols(kind, message):
    if not llmkern.simt_available():
        pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
    import llmkern._simt as m

    with pytest.raises(RuntimeError, match=message):
        m.simt_selftest_hopper_fault(kind, 0)


def test_accumulators_unreadable_before_wait():
    """A missing wait that the kernel gets away with on its exit path still reads NaN, not the result."""
    if not llmkern.simt_available():
        pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
    import llmkern._simt as m

    m.simt_selftest_hopper_fault(4, 0)  # raises if the early read saw a number


def test_selftest_bindings_name_bad_arguments():
    if not llmkern.simt_available():
        pytest.skip("llmkern._simt not built (LLMKERN_SIMT=ON)")
    import llmkern._simt as m

    z = lambda *s, dt=torch.int16: dl(torch.zeros(*s, dtype=dt))  # noqa: E731
    with pytest.raises(ValueError, match="n: 64 or 128"):
        m.simt_selftest_wgmma(z(64, 64), z(32, 64), z(4, 128, 4, dt=torch.int32), z(64, 32, dt=torch.float32),
                              z(64, 32, dt=torch.float32), 32, False, False, 128, False, 0)
    with pytest.raises(ValueError, match="swizzle"):
        m.simt_selftest_wgmma(z(64, 64), z(64, 64), z(4, 128, 4, dt=torch.int32), z(64, 64, dt=torch.float32),
                              z(64, 64, dt=torch.float32), 64, False, False, 16, False, 0)
    with pytest.raises(RuntimeError, match="tensor map was rejected"):  # row stride 40 B: not a multiple of 16
        m.simt_selftest_tma(z(7, 20), [0, 0], [16, 4], 32, z(64), 0)
