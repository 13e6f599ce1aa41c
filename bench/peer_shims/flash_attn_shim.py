"""Makes ``import flash_attn`` (and the submodules flash-attn's tests import) resolve to
llmkern.compat.flash_attn. Test-only helpers the peer's test file imports that are not part of
flash-attn's API are provided here: ``flash_attn.layers.rotary.apply_rotary_emb`` (the reference
rotation of the kvcache test; plain torch, fp32, written from flash-attn's documented semantics)
and the private ``_get_block_size_n`` / ``USE_TRITON_ROCM`` (dropout-mask layout; dropout is out
of scope). ``torch.autograd.grad`` of an output that carries no graph (llmkern is forward-only)
returns NaN gradients, so a test's forward assertions still run and its backward ones fail,
which peer_suites.py counts as out of scope."""
from __future__ import annotations

import sys
import types

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x [b, s, h, d]; cos/sin [seqlen_ro, rd/2]; sequence b's row i at position offsets[b] + i."""
    assert cu_seqlens is None, "reference shim: dense x only"
    b, s = x.shape[0], x.shape[1]
    rd = cos.shape[-1] * 2
    off = seqlen_offsets if torch.is_tensor(seqlen_offsets) else torch.full((b,), int(seqlen_offsets))
    pos = off.to(torch.long).view(b, 1).cpu() + torch.arange(s).view(1, s)  # [b, s]
    c = cos.float().cpu()[pos].unsqueeze(2)  # [b, s, 1, rd/2]
    sn = sin.float().cpu()[pos].unsqueeze(2)
    xf = x.float().cpu()
    xr = xf[..., :rd]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    o1, o2 = x1 * c - x2 * sn, x1 * sn + x2 * c
    rot = torch.stack([o1, o2], dim=-1).flatten(-2) if interleaved else torch.cat([o1, o2], dim=-1)
    out = torch.cat([rot, xf[..., rd:]], dim=-1).to(x.dtype).to(x.device)
    if inplace:
        x.copy_(out)
        return x
    return out


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    raise NotImplementedError("dropout-mask layout: dropout is out of scope for llmkern")


_real_grad = torch.autograd.grad


def _grad(outputs, inputs, grad_outputs=None, **kw):
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if not any(o.requires_grad for o in outs):
        ins = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        return tuple(torch.full_like(i, float("nan")) for i in ins)
    return _real_grad(outputs, inputs, grad_outputs, **kw)


def install() -> None:
    import llmkern.compat.flash_attn as fa
    from llmkern.compat.flash_attn import bert_padding, flash_attn_interface

    iface = types.ModuleType("flash_attn.flash_attn_interface")
    iface.__dict__.update({k: v for k, v in vars(flash_attn_interface).items() if not k.startswith("__")})
    iface._get_block_size_n = _get_block_size_n
    iface.USE_TRITON_ROCM = False
    layers = types.ModuleType("flash_attn.layers")
    rotary = types.ModuleType("flash_attn.layers.rotary")
    rotary.apply_rotary_emb = apply_rotary_emb
    layers.rotary = rotary
    sys.modules["flash_attn"] = fa
    sys.modules["flash_attn.flash_attn_interface"] = iface
    sys.modules["flash_attn.bert_padding"] = bert_padding
    sys.modules["flash_attn.layers"] = layers
    sys.modules["flash_attn.layers.rotary"] = rotary
    torch.autograd.grad = _grad
