"""The check that keeps the sm_90a prefill kernel on a Hopper GPU only when it agrees with the
mma.sync kernel (llmkern.ops.sm90_check), run with both kernels on the SIMT emulator; a kernel that
disagrees or did not run is refused, and the environment variable and non-Hopper devices skip it."""
from __future__ import annotations

import types

import pytest
import torch

import llmkern
from llmkern._backend import simt_available, simt_backend
from llmkern.ops import sm90_check
from llmkern.ops.attention import flash_attn_varlen_func

pytestmark = pytest.mark.skipif(not simt_available(), reason="needs the SIMT build (LLMKERN_SIMT=ON)")


def _switch(mod) -> bool:
    on = mod.use_sm90_prefill(True)
    mod.use_sm90_prefill(on)
    return on


def test_the_kernel_agrees_with_the_mma_sync_kernel():
    mod = llmkern._simt
    before = _switch(mod)
    with simt_backend():
        assert sm90_check.check(mod, "cpu") is None
    assert _switch(mod) == before   # the check leaves the switch as it found it


def test_a_kernel_that_differs_is_refused():
    mod = llmkern._simt

    def wrong_on_sm90(*a, **kw):
        o = flash_attn_varlen_func(*a, **kw)
        return o + 0.25 if _switch(mod) else o

    with simt_backend():
        why = sm90_check.check(mod, "cpu", attend=wrong_on_sm90)
    assert why is not None and "difference" in why


def test_a_kernel_that_did_not_run_is_refused():
    mod = llmkern._simt

    def always_mma_sync(*a, **kw):
        prev = mod.use_sm90_prefill(False)
        try:
            return flash_attn_varlen_func(*a, **kw)
        finally:
            mod.use_sm90_prefill(prev)

    with simt_backend():
        assert "did not run" in sm90_check.check(mod, "cpu", attend=always_mma_sync)


class _FakeLib:
    def __init__(self):
        self.on, self.checked = False, 0

    def use_sm90_prefill(self, on):
        prev, self.on = self.on, on
        return prev


@pytest.mark.parametrize("env,cap,want_on,want_checks", [
    (None, (8, 0), False, 0), ("1", (9, 0), True, 0), ("0", (9, 0), False, 0), (None, (9, 0), True, 1)])
def test_who_decides(monkeypatch, env, cap, want_on, want_checks):
    lib = _FakeLib()

    def fake_check(l, device):
        l.checked += 1
        return None

    monkeypatch.setattr(sm90_check, "_decided", None)
    monkeypatch.setattr(sm90_check, "check", fake_check)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    if env is None:
        monkeypatch.delenv("LLMKERN_SM90_PREFILL", raising=False)
    else:
        monkeypatch.setenv("LLMKERN_SM90_PREFILL", env)
    q = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    sm90_check.ensure_decided(q, lib)
    sm90_check.ensure_decided(q, lib)   # once per process
    assert sm90_check._decided is want_on and lib.checked == want_checks
    if want_checks:
        assert lib.on   # the check passed: selected


def test_a_failed_check_warns_and_keeps_the_old_kernel(monkeypatch):
    lib = _FakeLib()
    monkeypatch.setattr(sm90_check, "_decided", None)
    monkeypatch.setattr(sm90_check, "check", lambda l, d: "case x: max |difference| 1 > 0.03")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("LLMKERN_SM90_PREFILL", raising=False)
    with pytest.warns(RuntimeWarning, match="LLMKERN_SM90_PREFILL"):
        sm90_check.ensure_decided(types.SimpleNamespace(is_cuda=True, device="cuda:0"), lib)
    assert sm90_check._decided is False and not lib.on


def test_cpu_tensors_decide_nothing(monkeypatch):
    monkeypatch.setattr(sm90_check, "_decided", None)
    sm90_check.ensure_decided(torch.zeros(1), _FakeLib())
    assert sm90_check._decided is None


def test_nothing_is_decided_while_a_cuda_graph_is_captured(monkeypatch):
    lib = _FakeLib()
    monkeypatch.setattr(sm90_check, "_decided", None)
    monkeypatch.setattr(sm90_check, "check", lambda l, d: pytest.fail("checked during a capture"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.delenv("LLMKERN_SM90_PREFILL", raising=False)
    sm90_check.ensure_decided(types.SimpleNamespace(is_cuda=True, device="cuda:0"), lib)
    assert sm90_check._decided is None
