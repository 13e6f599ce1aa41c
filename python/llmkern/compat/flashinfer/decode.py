"""``flashinfer.decode`` (FlashInfer 0.6.x): ``single_decode_with_kv_cache`` and
``BatchDecodeWithPagedKVCacheWrapper`` on llmkern's attention kernels (see the package docstring
for what differs)."""
from __future__ import annotations

from typing import Optional

import torch

from ..._args import int_arg, require_tensor
from . import _attend
from ._attend import Options
from ._common import (check_dtypes, check_heads, check_layout, check_pos_encoding, dense_kv, rope_llama,
                      sm_scale_of, soft_cap_of, unpack_paged, unsupported, window_of)
from ._plan import keep_storage, plan_paged, rope_gather_index

__all__ = ["single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper",
           "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "fast_decode_plan"]


def single_decode_with_kv_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE", use_tensor_cores: bool = False,
    q_scale: Optional[float] = None, k_scale: Optional[float] = None, v_scale: Optional[float] = None,
    window_left: int = -1, logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None, rope_theta: Optional[float] = None, return_lse: bool = False,
):
    """One query token ``q [Hq, D]`` over ``k``/``v [kv_len, Hkv, D]`` (NHD) or ``[Hkv, kv_len, D]``
    (HND). Returns ``out [Hq, D]``, or ``(out, lse [Hq])`` (base-2 lse) with ``return_lse``."""
    require_tensor(q, "q", 2, "[num_qo_heads, head_dim]")
    require_tensor(k, "k", 3, "[kv_len, num_kv_heads, head_dim]")
    require_tensor(v, "v", 3, "[kv_len, num_kv_heads, head_dim]")
    check_dtypes(q, k)
    layout = check_layout(kv_layout)
    mode = check_pos_encoding(pos_encoding_mode)
    k, v = dense_kv(k, layout), dense_kv(v, layout)
    check_heads(q.shape[0], k.shape[1])
    scale = sm_scale_of(sm_scale, q.shape[-1])
    for s in (q_scale, k_scale):  # fp8 dequantisation scales fold into the softmax scale
        if s is not None:
            scale *= float(s)
    opt = Options(False, scale, window_of(window_left), soft_cap_of(logits_soft_cap), mode, rope_scale, rope_theta)
    kv_len = k.shape[0]
    if mode == "ROPE_LLAMA":
        q = rope_llama(q[None], torch.full((1,), kv_len - 1, device=q.device), rope_scale, rope_theta)[0]
        k = rope_llama(k, torch.arange(kv_len, device=k.device), rope_scale, rope_theta)
    res = _attend.decode(q[None], k[None], v[None], kv_len, opt, None, None, bool(return_lse))
    if return_lse:
        o, lse = res
        o, lse = o[0], lse[0]
    else:
        o = res[0]
    if v_scale is not None:
        o = (o.float() * float(v_scale)).to(o.dtype)
    return (o, lse) if return_lse else o


class BatchDecodeWithPagedKVCacheWrapper:
    """Decode over a paged KV cache: ``plan()`` once per batch layout (on the host), ``run()`` per
    layer. The workspace buffer is accepted and unused (llmkern's split-KV scratch comes from
    torch's allocator); ``use_tensor_cores`` and ``backend`` choose among FlashInfer's kernels
    and change nothing here, except that FlashInfer's multi-token decode (``q_len_per_req > 1``:
    each request's last ``q_len_per_req`` positions, causal among themselves) needs
    ``use_tensor_cores=True`` and the fa2 backend, and the checks follow FlashInfer's."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
                 paged_kv_indices_buffer: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
                 backend: str = "auto", jit_args=None, jit_kwargs=None):
        self._kv_layout = check_layout(kv_layout)
        self._workspace = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._backend = backend
        self._q_len = None  # q_len_per_req of the last plan (fixed once planned under CUDA graphs)
        self._indices_capacity = (None if paged_kv_indices_buffer is None or not use_cuda_graph
                                  else paged_kv_indices_buffer.numel())
        self._slots = {}
        self._plan = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def _check_q_len(self, q_len_per_req) -> int:
        q_len = int_arg(q_len_per_req, "q_len_per_req", 1)
        if q_len > 1 and not self._use_tensor_cores:
            raise ValueError(f"q_len_per_req={q_len} needs use_tensor_cores=True (multi-token decode runs on "
                             "the prefill kernels, as in FlashInfer)")
        if q_len > 1 and self._backend not in ("auto", "fa2"):
            raise NotImplementedError(f"q_len_per_req > 1 with backend={self._backend!r}: only 'fa2' (or 'auto') "
                                      "runs multi-token decode")
        if self._use_cuda_graph and self._q_len is not None and q_len != self._q_len:
            # A captured graph baked in the query count; a new one would replay with stale shapes.
            raise ValueError(f"q_len_per_req is frozen at {self._q_len} for this CUDA-graph wrapper (got {q_len})")
        return q_len

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer=None) -> None:
        self._workspace = float_workspace_buffer

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: Optional[float] = None, q_data_type="float16", kv_data_type=None,
             data_type=None, sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True, block_tables=None,
             seq_lens=None, fixed_split_size=None, disable_split_kv: bool = False, q_len_per_req: int = 1,
             **_ignored) -> None:
        q_len = self._check_q_len(q_len_per_req)
        num_qo_heads = int_arg(num_qo_heads, "num_qo_heads", 1)
        num_kv_heads = int_arg(num_kv_heads, "num_kv_heads", 1)
        check_heads(num_qo_heads, num_kv_heads)
        p = plan_paged(indptr, indices, last_page_len, page_size, self._device, self._indices_capacity)
        if q_len > 1 and (p.kv_lens_host < q_len).any():
            raise ValueError(f"a sequence holds fewer than q_len_per_req={q_len} keys: its first queries would "
                             "attend to an empty KV range")
        keep = self._use_cuda_graph
        p.block_table = keep_storage(self._slots, "block_table", p.block_table, keep)
        p.kv_lens = keep_storage(self._slots, "kv_lens", p.kv_lens, keep)
        mode = check_pos_encoding(pos_encoding_mode)
        self._opt = Options(False, sm_scale_of(sm_scale, int_arg(head_dim, "head_dim", 1)),
                            window_of(window_left), soft_cap_of(logits_soft_cap), mode, rope_scale, rope_theta)
        self._heads = (num_qo_heads, num_kv_heads)
        self._rope = None
        batch = p.kv_lens_host.numel()
        if q_len > 1 or mode == "ROPE_LLAMA":
            # Runs as a causal ragged prefill: q_len queries per request, the last positions.
            self._cu_q = keep_storage(self._slots, "cu_q", torch.arange(0, (batch + 1) * q_len, q_len,
                                                                      dtype=torch.int32).to(self._device), keep)
        if mode == "ROPE_LLAMA":
            # Keys rotate at their positions: run() gathers them by this index (built here, on host).
            page, off, _ = rope_gather_index(p.kv_lens_host, p.block_table.cpu().long(), p.page_size)
            q_pos, k_pos = _attend.positions(torch.full((batch,), q_len), p.kv_lens_host, self._device)
            self._rope = (page.to(self._device), off.to(self._device), q_pos, k_pos)
        self._q_len = q_len
        self._plan = p

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl=None, window_left: Optional[int] = None,
            sinks=None, **_ignored):
        """``q [batch * q_len_per_req, Hq, D]`` -> ``out`` of that shape, or ``(out, lse [rows, Hq])``
        (base-2)."""
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        unsupported(sinks=sinks)
        require_tensor(q, "q", 3, "[batch_size, num_qo_heads, head_dim]")
        k_cache, v_cache = unpack_paged(paged_kv_cache, self._kv_layout)
        check_dtypes(q, k_cache)
        p, opt, q_len = self._plan, self._opt, self._q_len
        if q.shape[0] != p.kv_lens.numel() * q_len:
            raise ValueError(f"q: {q.shape[0]} rows, the plan needs batch_size ({p.kv_lens.numel()}) * "
                             f"q_len_per_req ({q_len})")
        if q_scale is not None or k_scale is not None or window_left is not None or q_len > 1:
            opt = Options(**vars(opt))
            opt.causal = q_len > 1
            opt.sm_scale *= float(q_scale if q_scale is not None else 1.0) * float(k_scale if k_scale is not None else 1.0)
            if window_left is not None:
                opt.window_left = int_arg(window_left, "window_left")
        want = bool(return_lse) or lse is not None
        if self._rope is not None:
            page, off, q_pos, k_pos = self._rope
            res = _attend.ragged(q, k_cache[page, off], v_cache[page, off], self._cu_q, p.cu_kv, q_len,
                                 max(p.max_kv, 1), opt, out, lse, want, q_pos=q_pos, k_pos=k_pos)
        elif q_len > 1:
            res = _attend.ragged(q, k_cache, v_cache, self._cu_q, p.cu_kv, q_len, max(p.max_kv, 1), opt, out, lse,
                                 want, block_table=p.block_table)
        else:
            res = _attend.decode(q, k_cache, v_cache, p.kv_lens, opt, out, lse, want, p.block_table)
        if v_scale is not None:
            o = res[0] if want else res
            o.copy_((o.float() * float(v_scale)).to(o.dtype))
        if return_lse:
            return res
        return res[0] if want else res

    forward = run

    def run_return_lse(self, q, paged_kv_cache, *args, **kw):
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kw)

    def end_forward(self) -> None:
        """Kept for old callers: nothing to release."""


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's older spelling of a CUDA-graph decode wrapper: the index buffers come first and
    every plan keeps its tensors' storage (``use_cuda_graph=True``)."""

    def __init__(self, workspace_buffer: torch.Tensor, indptr_buffer: torch.Tensor, indices_buffer: torch.Tensor,
                 last_page_len_buffer: torch.Tensor, kv_layout: str = "NHD", use_tensor_cores: bool = False):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


def fast_decode_plan(wrapper: BatchDecodeWithPagedKVCacheWrapper, *args, **kwargs) -> None:
    """FlashInfer's lighter re-plan for CUDA-graph decode (``wrapper.plan = partial(
    fast_decode_plan, wrapper)``): here the same as ``plan()``, whose host work is already small;
    its extra arguments (``non_blocking``, ``global_override_indptr_cpu``) change nothing. As in
    FlashInfer it re-plans: a wrapper never planned is refused."""
    if wrapper._plan is None:
        raise ValueError("fast_decode_plan needs a prior plan() on this wrapper")
    BatchDecodeWithPagedKVCacheWrapper.plan(wrapper, *args, **kwargs)
