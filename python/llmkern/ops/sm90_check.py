"""Whether prefill runs on the sm_90a kernel (csrc/attention/flash_prefill_sm90.cu) on a Hopper GPU.

That kernel (TMA + mbarrier + wgmma) is tested in CI only under the SIMT emulator, which models
those instructions from the PTX ISA; a misreading shared by the kernel and the emulator would show
only on hardware. So on the first attention call on an sm_90 device, a few small prefills (dense
causal GQA, paged with page size 16 over a cached prefix, softcap, head dims 64 and 128, bf16 and
fp16) run on it and on the mma.sync kernel, and it stays selected only if every output agrees within
flash-attn's tolerance; otherwise the process warns once and keeps the mma.sync kernel.
LLMKERN_SM90_PREFILL=1 selects it without the check, LLMKERN_SM90_PREFILL=0 never."""
from __future__ import annotations

import itertools
import os
import threading
import warnings
from typing import Callable, Optional

import torch

_lock = threading.Lock()
_decided: Optional[bool] = None   # None: not yet looked at in this process
# The cases' default prefill: ops.attention's flash_attn_varlen_func, handed over by attention at
# import. Attention imports this module (its ops call ensure_decided), so this one cannot import it.
_attend: Optional[Callable] = None


def set_default_attend(attend: Callable) -> None:
    global _attend
    _attend = attend


def _cu(lens, device) -> torch.Tensor:
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


def _cases(device, attend: Callable):
    """(name, output) of each check case; `attend` has flash_attn_varlen_func's signature."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    out = []
    for dtype, d in ((torch.bfloat16, 128), (torch.float16, 64)):
        # dense, two sequences (one a prefix-extended chunk), GQA 4/2, causal
        lq, lk = [150, 40], [170, 300]
        cq, ck = _cu(lq, device), _cu(lk, device)
        q, k, v = rnd(sum(lq), 4, d, dtype=dtype), rnd(sum(lk), 2, d, dtype=dtype), rnd(sum(lk), 2, d, dtype=dtype)
        out.append((f"{dtype}-hd{d}-dense", attend(q, k, v, cq, ck, max(lq), max(lk), causal=True)))
        out.append((f"{dtype}-hd{d}-softcap", attend(q, k, v, cq, ck, max(lq), max(lk), causal=True, softcap=30.0)))
        # paged, page 16, the engine's chunked prefill: queries are the tail of longer keys
        page, lk = 16, [290, 20]
        pages = [-(-n // page) for n in lk]
        kc, vc = rnd(sum(pages) + 1, page, 2, d, dtype=dtype), rnd(sum(pages) + 1, page, 2, d, dtype=dtype)
        perm = torch.randperm(sum(pages), generator=g) + 1          # block 0 unused: no offset luck
        table = torch.zeros(2, max(pages), dtype=torch.int32)
        table[0, :pages[0]], table[1, :pages[1]] = perm[:pages[0]], perm[pages[0]:]
        lq = [130, 20]
        cq, ck = _cu(lq, device), _cu(lk, device)
        q = rnd(sum(lq), 4, d, dtype=dtype)
        out.append((f"{dtype}-hd{d}-paged16", attend(q, kc, vc, cq, ck, max(lq), max(lk), causal=True,
                                                     block_table=table.to(device))))
    return out


def check(lib, device, attend: Optional[Callable] = None) -> Optional[str]:
    """Runs the cases on `lib`'s two prefill kernels; None if they agree, else what differed.
    An error raised on the sm_90a side is reported as the disagreement, not raised. `attend`
    defaults to llmkern's flash_attn_varlen_func."""
    if attend is None:
        attend = _attend
    prev = lib.use_sm90_prefill(False)
    try:
        want = _cases(device, attend)
        lib.use_sm90_prefill(True)
        before = lib.sm90_prefill_launches()
        try:
            got = _cases(device, attend)
        except Exception as e:  # noqa: BLE001 (any failure of the new kernel means: keep the old)
            return f"it raised {type(e).__name__}: {e}"
        if lib.sm90_prefill_launches() - before < len(got):
            return "it did not run (no sm_90a code in this build?)"
        for (name, a), (_, b) in zip(want, got):
            tol = 3e-2 if a.dtype == torch.bfloat16 else 5e-3
            err = (a.float() - b.float()).abs().max().item()
            if not err <= tol:   # NaN too
                return f"case {name}: max |difference| {err:.3g} > {tol}"
        return None
    finally:
        lib.use_sm90_prefill(prev)


def ensure_decided(t: torch.Tensor, lib) -> None:
    """Called by the attention ops with their query tensor: decides once per process."""
    global _decided
    if _decided is not None or not t.is_cuda or torch.cuda.is_current_stream_capturing():
        return   # (a CUDA graph being captured must not see the check's syncs: decide on a later call)
    with _lock:
        if _decided is not None:
            return
        env = os.environ.get("LLMKERN_SM90_PREFILL")
        if env in ("0", "1") or torch.cuda.get_device_capability(t.device) != (9, 0):
            _decided = env == "1"   # the extension read the variable itself at load
            return
        _decided = False            # the check's own calls come back here: not again
        why = check(lib, t.device)
        _decided = why is None
        lib.use_sm90_prefill(_decided)
        if why is not None:
            warnings.warn(f"llmkern: the sm_90a prefill kernel is not used in this process: {why} "
                          "(set LLMKERN_SM90_PREFILL=1 to force it, =0 to skip this check)", RuntimeWarning,
                          stacklevel=3)
