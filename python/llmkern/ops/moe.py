"""Mixture-of-experts ops (vLLM's fused-MoE semantics) -> csrc/moe/.

- ``topk_softmax``: router logits -> top-k expert weights and ids (softmax over all experts in fp32).
- ``moe_align_block_size``: the (token, expert) pairs grouped by expert, each group padded to a
  multiple of ``block_size`` (the row tiles of a grouped GEMM).
- ``fused_moe``: ``out[t] = sum_k w[t,k] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with
  ``e = topk_ids[t,k]``; experts that no token picked cost nothing.
- ``pack_moe_weights``: the CPU path's experts packed once at load time for the register-tiled GEMMs
  (csrc/linear/gemm_cpu.h, fp32; gemm_bf16_cpu.h / gemm_bf16_amx_cpu.h, bf16); ``fused_moe`` takes the
  packed object in place of ``w13, w2``.

Expert parallelism: ``topk_ids`` entries equal to -1 are skipped, and ``expert_map`` (int32
``[global_num_experts]``, -1 = expert not on this rank) maps the router's global ids to rows of
the local ``w13``/``w2``, as vLLM's ``expert_map`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from .._args import int_arg, optional_tensor
from .._backend import _C, dl, kernel_op, lib_for, require_tensor, stream_of
from ._index_args import as_int32_index
from .linear import pack_gate_up_weight_bf16, pack_linear_weight_bf16

__all__ = ["topk_softmax", "moe_align_block_size", "fused_moe", "pack_moe_weights", "MoEWeights"]
# Not torch.library ops themselves: fused_moe picks one of the registered ops fused_moe_out /
# fused_moe_packed_out (a MoEWeights cannot cross the dispatcher), pack_moe_weights is torch
# reshapes, MoEWeights a container; torch.compile traces through all three.
COMPOSED = ("fused_moe", "pack_moe_weights", "MoEWeights")

PANEL = 16  # output features per packed panel (csrc/linear/gemm_cpu.h)
ACTIVATIONS = ("silu",)


def _int32(t, name: str) -> torch.Tensor:
    """An id tensor as the contiguous int32 the kernels read (int64 ids narrowed once they are known
    to fit; the kernels' front end then checks the experts' range)."""
    return as_int32_index(t, name).contiguous()


def _float32(t, name: str) -> torch.Tensor:
    require_tensor(t, name)
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    return t.to(torch.float32).contiguous()


@kernel_op("topk_softmax")
def topk_softmax(gating_output: torch.Tensor, topk: int, renormalize: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """``gating_output [T, E]`` (router logits, fp32/fp16/bf16) -> ``(topk_weights fp32 [T, k],
    topk_ids int32 [T, k])``: softmax over all E experts in fp32, the k largest probabilities in
    descending order (ties: the lower expert id first), renormalised to sum 1 when ``renormalize``."""
    require_tensor(gating_output, "gating_output", 2, "[num_tokens, num_experts]")
    k = int_arg(topk, "topk")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize).__name__}")
    T, E = gating_output.shape
    if not 1 <= k <= E:
        raise ValueError(f"topk: must be in [1, num_experts={E}], got {k}")
    weights = torch.empty(T, k, dtype=torch.float32, device=gating_output.device)
    ids = torch.empty(T, k, dtype=torch.int32, device=gating_output.device)
    lib_for(gating_output).topk_softmax(dl(weights), dl(ids), dl(gating_output, "gating_output"), renormalize,
                                        stream_of(gating_output))
    return weights, ids


@topk_softmax.op.register_fake
def _(gating_output, topk, renormalize=False):
    T = gating_output.shape[0]
    return (gating_output.new_empty(T, topk, dtype=torch.float32), gating_output.new_empty(T, topk, dtype=torch.int32))


def align_sizes(numel: int, num_experts: int, block_size: int) -> Tuple[int, int]:
    """(length of sorted_token_ids, length of expert_ids): the worst case over all routings, so the
    outputs have shapes known before the ids are read (CUDA graphs, torch.compile)."""
    max_padded = numel + num_experts * (block_size - 1)
    return max_padded, -(-max_padded // block_size)


@kernel_op("moe_align_block_size")
def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int
                         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the (token, slot) pairs of ``topk_ids [T, k]`` by expert, each expert's group padded to a
    multiple of ``block_size``:

    - ``sorted_token_ids`` int32 ``[numel + num_experts * (block_size - 1)]``: flat indices ``t * k + j``
      into topk_ids, expert 0's pairs first (in token order), then expert 1's, ...; padding and the
      unused tail hold ``numel`` (one past the last pair).
    - ``expert_ids`` int32 ``[ceil(len(sorted_token_ids) / block_size)]``: the expert of each block of
      ``block_size`` entries; -1 for blocks past ``num_tokens_post_pad``.
    - ``num_tokens_post_pad`` int32 ``[1]``: the used length of sorted_token_ids.

    Ids equal to -1 (experts on another rank) are left out; other ids must be in [0, num_experts).
    Experts with no pairs take no blocks."""
    require_tensor(topk_ids, "topk_ids", 2, "[num_tokens, topk]")
    E = int_arg(num_experts, "num_experts", 1, 1 << 20)
    B = int_arg(block_size, "block_size", 1, 1 << 16)
    n_sorted, n_blocks = align_sizes(topk_ids.numel(), E, B)
    dev = topk_ids.device
    sorted_ids = torch.empty(n_sorted, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(n_blocks, dtype=torch.int32, device=dev)
    post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    topk_ids = _int32(topk_ids, "topk_ids")
    lib_for(topk_ids).moe_align_block_size(dl(topk_ids, "topk_ids"), E, B, dl(sorted_ids), dl(expert_ids),
                                           dl(post_pad), stream_of(topk_ids))
    return sorted_ids, expert_ids, post_pad


@moe_align_block_size.op.register_fake
def _(topk_ids, num_experts, block_size):
    n_sorted, n_blocks = align_sizes(topk_ids.numel(), num_experts, block_size)
    return (topk_ids.new_empty(n_sorted, dtype=torch.int32), topk_ids.new_empty(n_blocks, dtype=torch.int32),
            topk_ids.new_empty(1, dtype=torch.int32))


@dataclass(frozen=True)
class MoEWeights:
    """Experts packed once for the CPU GEMMs, with the unpacked sizes. Made by ``pack_moe_weights``:
    fp32 panels ``w13 [E, ceil(2I/16), H, 16]``, ``w2 [E, ceil(H/16), I, 16]`` (each expert packed
    as pack_linear_weight packs one), or bf16 panels in k pairs ``w13 [E, 2 ceil(I/16), ceil(H/2),
    16, 2]`` (pack_gate_up_weight_bf16 of each expert's gate and up rows), ``w2 [E, ceil(H/16),
    ceil(I/2), 16, 2]`` (pack_linear_weight_bf16), which run on the bf16 GEMM (AMX tiles or
    AVX512_BF16) with bf16 hidden states."""
    w13: torch.Tensor
    w2: torch.Tensor
    num_experts: int
    hidden_size: int
    intermediate_size: int


def _pack_experts(w: torch.Tensor) -> torch.Tensor:
    E, n, k = w.shape
    w = w.float()
    pad = -n % PANEL
    if pad:
        w = torch.cat([w, w.new_zeros(E, pad, k)], dim=1)
    return w.view(E, w.shape[1] // PANEL, PANEL, k).transpose(2, 3).contiguous()


def _pack_experts_bf16(w13: torch.Tensor, w2: torch.Tensor, I: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return (torch.stack([pack_gate_up_weight_bf16(w[:I], w[I:]) for w in w13]),
            torch.stack([pack_linear_weight_bf16(w) for w in w2]))


def pack_moe_weights(w13: torch.Tensor, w2: torch.Tensor, dtype: Optional[torch.dtype] = None) -> MoEWeights:
    """``w13 [E, 2I, H]`` (gate rows then up rows) and ``w2 [E, H, I]`` -> a ``MoEWeights`` for
    ``fused_moe`` on CPU. Call once at load time; the originals can then be dropped.
    ``dtype``: the packed weights' dtype, ``torch.float32`` (any hidden-state dtype) or
    ``torch.bfloat16`` (bf16 hidden states; half the bytes per decode step); default bf16 for
    bf16 weights, else fp32."""
    E, H, I = _check_weights(w13, w2)
    for t, name in ((w13, "w13"), (w2, "w2")):
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if w13.is_cuda or w2.is_cuda:
        raise ValueError("w13: the packed layout is for the CPU GEMM; pass CPU tensors")
    if dtype is None:
        dtype = torch.bfloat16 if w13.dtype == torch.bfloat16 else torch.float32
    if dtype == torch.bfloat16:
        return MoEWeights(*_pack_experts_bf16(w13, w2, I), E, H, I)
    if dtype != torch.float32:
        raise ValueError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype}")
    return MoEWeights(_pack_experts(w13), _pack_experts(w2), E, H, I)


def _check_weights(w13, w2) -> Tuple[int, int, int]:
    require_tensor(w13, "w13", 3, "[num_experts, 2 * intermediate_size, hidden_size]")
    require_tensor(w2, "w2", 3, "[num_experts, hidden_size, intermediate_size]")
    E, I2, H = w13.shape
    if I2 % 2:
        raise ValueError(f"w13: dim 1 must be 2 * intermediate_size (gate then up rows), got {I2}")
    if tuple(w2.shape) != (E, H, I2 // 2):
        raise ValueError(f"w2: expected shape [num_experts, hidden_size, intermediate_size] = {(E, H, I2 // 2)} "
                         f"(from w13 {tuple(w13.shape)}), got {tuple(w2.shape)}")
    return E, H, I2 // 2


@kernel_op("fused_moe_out", mutates_args=("out",))
def _fused_moe_out(out: torch.Tensor, hidden_states: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> None:
    lib = lib_for(hidden_states)
    workspace = None
    if lib is not _C or hidden_states.is_cuda:  # the CUDA kernels' intermediates (csrc/moe/moe_workspace.h)
        E, I2, H = w13.shape
        nbytes = lib.fused_moe_workspace_bytes(topk_ids.numel(), E, H, I2 // 2, hidden_states.element_size())
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=hidden_states.device)
    lib.fused_moe(dl(out, "out"), dl(hidden_states, "hidden_states"), dl(w13, "w13"), dl(w2, "w2"),
                  dl(topk_weights, "topk_weights"), dl(topk_ids, "topk_ids"), dl(expert_map, "expert_map"),
                  dl(workspace), stream_of(hidden_states))


@_fused_moe_out.op.register_fake
def _(out, hidden_states, w13, w2, topk_weights, topk_ids, expert_map):
    return None


@kernel_op("fused_moe_packed_out", mutates_args=("out",))
def _fused_moe_packed_out(out: torch.Tensor, hidden_states: torch.Tensor, w13_packed: torch.Tensor,
                          w2_packed: torch.Tensor, intermediate_size: int, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> None:
    lib_for(hidden_states).fused_moe_packed(
        dl(out, "out"), dl(hidden_states, "hidden_states"), dl(w13_packed, "w13"), dl(w2_packed, "w2"),
        intermediate_size, dl(topk_weights, "topk_weights"), dl(topk_ids, "topk_ids"),
        dl(expert_map, "expert_map"), stream_of(hidden_states))


@_fused_moe_packed_out.op.register_fake
def _(out, hidden_states, w13_packed, w2_packed, intermediate_size, topk_weights, topk_ids, expert_map):
    return None


def fused_moe(hidden_states: torch.Tensor, w13: Union[torch.Tensor, MoEWeights], w2: Optional[torch.Tensor],
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, activation: str = "silu",
              expert_map: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The MoE block of Mixtral / Qwen-MoE after the router:
    ``out[t] = sum_j topk_weights[t,j] * w2[e] @ (silu(w13[e,:I] @ x[t]) * (w13[e,I:] @ x[t]))``
    with ``e = topk_ids[t,j]`` (mapped through ``expert_map`` when given).

    - ``hidden_states [T, H]`` fp32/fp16/bf16; ``w13 [E, 2I, H]`` (gate rows, then up rows, as vLLM
      stacks them) and ``w2 [E, H, I]`` of the same dtype; or ``w13 = pack_moe_weights(w13, w2)``
      with ``w2=None`` (CPU: experts packed once at load time, the fast CPU path).
    - ``topk_weights [T, k]`` (any float dtype, read as fp32), ``topk_ids [T, k]`` int32/int64; ids
      equal to -1 contribute nothing (tokens routed to experts on other ranks).
    - ``expert_map`` int32/int64 ``[global_num_experts]``: global id -> local expert row, -1 = not
      local (contributes nothing). Without it ids index w13/w2 directly.
    - ``out [T, H]`` (hidden_states' dtype), written and returned; allocated when None. It may be
      hidden_states itself (in place, vLLM's ``inplace=True``) but share no memory with the others.
    On CPU the intermediates are fp32 and the result is rounded once to hidden_states' dtype; the
    CUDA kernels (fp16/bf16 on tensor cores, fp32 accumulation) round the SiLU-and-mul activations
    to the input dtype before the down projection, as vLLM's do. Experts no token picked are not
    read. CUDA tensors get a scratch buffer from torch's allocator (CUDA-graph safe; no host sync).
    """
    require_tensor(hidden_states, "hidden_states", 2, "[num_tokens, hidden_size]")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    optional_tensor(expert_map, "expert_map")
    packed = isinstance(w13, MoEWeights)
    if packed:
        if w2 is not None:
            raise ValueError("w2: must be None when w13 is a MoEWeights (pack_moe_weights holds both)")
        if w13.w13.dtype == torch.bfloat16 and hidden_states.dtype != torch.bfloat16:
            raise ValueError(f"hidden_states: bf16-packed experts take bf16 hidden states, got {hidden_states.dtype} "
                             "(pack_moe_weights(..., dtype=torch.float32) takes any)")
        H = w13.hidden_size
    else:
        _, H, _ = _check_weights(w13, w2)
    topk_weights = _float32(topk_weights, "topk_weights")
    topk_ids = _int32(topk_ids, "topk_ids")
    if expert_map is not None:
        expert_map = _int32(expert_map, "expert_map")
    if out is None:
        out = hidden_states.new_empty(hidden_states.shape[0], H)
    else:
        require_tensor(out, "out", 2, "[num_tokens, hidden_size]")
    if packed:
        _fused_moe_packed_out(out, hidden_states, w13.w13, w13.w2, w13.intermediate_size, topk_weights, topk_ids,
                              expert_map)
    else:
        _fused_moe_out(out, hidden_states, w13, w2, topk_weights, topk_ids, expert_map)
    return out
