"""``flashinfer.prefill`` (FlashInfer 0.6.x): ``single_prefill_with_kv_cache`` (and its
``_return_lse`` form), ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchPrefillWithRaggedKVCacheWrapper`` on llmkern's attention kernels."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ..._args import int_arg, require_tensor
from . import _attend
from ._attend import Options
from ._common import (check_dtypes, check_heads, check_layout, check_pos_encoding, dense_kv, sm_scale_of,
                      soft_cap_of, unpack_paged, unsupported, window_of)
from ._plan import host_ints, indptr_lengths, keep_storage, plan_paged, rope_gather_index

__all__ = ["single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse",
           "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"]


def single_prefill_with_kv_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale_q=None, scale_k=None, scale_v=None,
    o_dtype=None, custom_mask: Optional[torch.Tensor] = None, packed_custom_mask=None,
    causal: bool = False, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None, window_left: int = -1,
    logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None, backend: str = "auto", return_lse: bool = False,
):
    """``q [qo_len, Hq, D]`` over ``k``/``v [kv_len, Hkv, D]`` (NHD) or ``[Hkv, kv_len, D]`` (HND).
    Returns ``out [qo_len, Hq, D]``, or ``(out, lse [qo_len, Hq])`` (base-2) with ``return_lse``."""
    require_tensor(q, "q", 3, "[qo_len, num_qo_heads, head_dim]")
    require_tensor(k, "k", 3, "[kv_len, num_kv_heads, head_dim]")
    require_tensor(v, "v", 3, "[kv_len, num_kv_heads, head_dim]")
    unsupported(packed_custom_mask=packed_custom_mask, scale_q=scale_q,
                scale_k=scale_k, scale_v=scale_v)
    check_dtypes(q, k)
    layout = check_layout(kv_layout)
    k, v = dense_kv(k, layout), dense_kv(v, layout)
    check_heads(q.shape[1], k.shape[1])
    opt = Options(bool(causal), sm_scale_of(sm_scale, q.shape[-1]), window_of(window_left),
                  soft_cap_of(logits_soft_cap), check_pos_encoding(pos_encoding_mode), rope_scale, rope_theta)
    qo_len, kv_len = q.shape[0], k.shape[0]
    cu_q = torch.tensor([0, qo_len], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, kv_len], dtype=torch.int32, device=q.device)
    q_pos = torch.arange(kv_len - qo_len, kv_len, device=q.device)
    k_pos = torch.arange(kv_len, device=q.device)
    mask = _flat_mask(custom_mask, qo_len * kv_len)
    res = _attend.ragged(q, k, v, cu_q, cu_k, qo_len, kv_len, opt, None, None, bool(return_lse), q_pos, k_pos,
                         custom_mask=mask)
    if o_dtype is not None:
        res = (res[0].to(o_dtype), res[1]) if return_lse else res.to(o_dtype)
    return res


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)


def _prefill_options(causal, pos_encoding_mode, sm_scale, head_dim, window_left, logits_soft_cap,
                     rope_scale, rope_theta, head_dim_vo, custom_mask, packed_custom_mask) -> Options:
    head_dim = int_arg(head_dim, "head_dim_qk", 1)
    if head_dim_vo is not None and int(head_dim_vo) != head_dim:
        raise NotImplementedError("head_dim_vo: llmkern's kernels need head_dim_vo == head_dim_qk")
    unsupported(packed_custom_mask=packed_custom_mask)
    return Options(bool(causal), sm_scale_of(sm_scale, head_dim), window_of(window_left),
                   soft_cap_of(logits_soft_cap), check_pos_encoding(pos_encoding_mode), rope_scale, rope_theta)


def _flat_mask(custom_mask, size: int) -> Optional[torch.Tensor]:
    """FlashInfer's boolean ``custom_mask`` (True = attend) flattened; ``size`` = the sum of the
    requests' ``qo_len * kv_len``. It replaces the causal mask (the torch path applies it)."""
    if custom_mask is None:
        return None
    require_tensor(custom_mask, "custom_mask")
    if custom_mask.numel() != size:
        raise ValueError(f"custom_mask: {custom_mask.numel()} entries, expected {size} (qo_len * kv_len per request)")
    return custom_mask.reshape(-1).to(torch.bool)


def _run_options(opt: Options, q_scale, k_scale, window_left) -> Options:
    if q_scale is None and k_scale is None and window_left is None:
        return opt
    opt = Options(**vars(opt))
    for s in (q_scale, k_scale):
        if s is not None:
            opt.sm_scale *= float(s)
    if window_left is not None:
        opt.window_left = int_arg(window_left, "window_left")
    return opt


def _finish(res, want: bool, return_lse: bool, v_scale):
    if v_scale is not None:
        o = res[0] if want else res
        o.copy_((o.float() * float(v_scale)).to(o.dtype))
    if return_lse or not want:
        return res
    return res[0]


_MULTI_ITEM = ("prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr")


class _Wrapper:
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False):
        self._kv_layout = check_layout(kv_layout)
        self._workspace = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._slots = {}
        self._planned = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer=None) -> None:
        self._workspace = float_workspace_buffer

    def _plan_queries(self, qo_indptr, num_qo_heads, num_kv_heads, *opts, extra=None) -> None:
        """What both prefill plans share: the options and the queries' indptr. ``extra``: the
        plan's other keywords; FlashInfer's multi-item scoring ones change the mask, so they are
        refused rather than ignored."""
        unsupported(**{k: (extra or {}).get(k) for k in _MULTI_ITEM})
        check_heads(int_arg(num_qo_heads, "num_qo_heads", 1), int_arg(num_kv_heads, "num_kv_heads", 1))
        self._opt = _prefill_options(*opts)
        host = host_ints(qo_indptr, "qo_indptr")
        self._lens_q = indptr_lengths(host, "qo_indptr")
        self._cu_q = keep_storage(self._slots, "qo_indptr", (host - host[0]).to(self._device, torch.int32),
                                  self._use_cuda_graph)
        self._max_q = int(self._lens_q.max()) if self._lens_q.numel() else 0

    def _check_run(self, q: torch.Tensor) -> None:
        if not self._planned:
            raise RuntimeError("plan() must be called before run()")
        require_tensor(q, "q", 3, "[qo_indptr[-1], num_qo_heads, head_dim]")
        if q.shape[0] < int(self._lens_q.sum()):
            raise ValueError(f"q: {q.shape[0]} rows, the plan's qo_indptr needs {int(self._lens_q.sum())}")

    def end_forward(self) -> None:
        """Kept for old callers: nothing to release."""


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """Prefill / append over a paged KV cache (chunked prefill, prefix hits): each sequence's
    queries are the last ``qo_len`` of its ``kv_len`` keys. The workspace buffer is accepted and
    unused; ``backend`` changes nothing."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
                 paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend: str = "auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)
        self._indices_capacity = (paged_kv_indices_buf.numel() if use_cuda_graph and paged_kv_indices_buf is not None
                                  else None)

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo: Optional[int] = None, custom_mask=None, packed_custom_mask=None,
             causal: bool = False, pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1, logits_soft_cap: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking: bool = True, **_ignored) -> None:
        self._plan_queries(qo_indptr, num_qo_heads, num_kv_heads, causal, pos_encoding_mode, sm_scale, head_dim_qk,
                           window_left, logits_soft_cap, rope_scale, rope_theta, head_dim_vo, custom_mask,
                           packed_custom_mask, extra=_ignored)
        p = plan_paged(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size, self._device,
                       self._indices_capacity)
        if p.kv_lens_host.numel() != self._lens_q.numel():
            raise ValueError(f"qo_indptr: batch {self._lens_q.numel()} differs from paged_kv_indptr's "
                             f"{p.kv_lens_host.numel()}")
        self._mask = _flat_mask(custom_mask, int((self._lens_q * p.kv_lens_host).sum()))
        # Causal with more queries than keys is allowed (as FlashInfer now does): the first
        # qo_len - kv_len rows see no key and come out 0 with lse -inf.
        keep = self._use_cuda_graph
        p.block_table = keep_storage(self._slots, "block_table", p.block_table, keep)
        p.cu_kv = keep_storage(self._slots, "cu_kv", p.cu_kv, keep)
        self._rope = None
        if self._opt.pos_encoding == "ROPE_LLAMA":
            page, off, _ = rope_gather_index(p.kv_lens_host, p.block_table.cpu().long(), p.page_size)
            q_pos, k_pos = _attend.positions(self._lens_q, p.kv_lens_host, self._device)
            self._rope = (page.to(self._device), off.to(self._device), q_pos, k_pos)
        self._plan = p
        self._planned = True

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl=None, window_left: Optional[int] = None, sinks=None,
            **_ignored):
        """``q [qo_indptr[-1], Hq, D]`` -> ``out`` of that shape, or ``(out, lse [nnz, Hq])`` (base-2)."""
        self._check_run(q)
        unsupported(sinks=sinks)
        k_cache, v_cache = unpack_paged(paged_kv_cache, self._kv_layout)
        check_dtypes(q, k_cache)
        p, opt = self._plan, _run_options(self._opt, q_scale, k_scale, window_left)
        want = bool(return_lse) or lse is not None
        max_kv = max(p.max_kv, 1)
        if self._rope is None:
            res = _attend.ragged(q, k_cache, v_cache, self._cu_q, p.cu_kv, self._max_q, max_kv, opt, out, lse,
                                 want, block_table=p.block_table, custom_mask=self._mask)
        else:
            page, off, q_pos, k_pos = self._rope
            res = _attend.ragged(q, k_cache[page, off], v_cache[page, off], self._cu_q, p.cu_kv, self._max_q,
                                 max_kv, opt, out, lse, want, q_pos=q_pos, k_pos=k_pos, custom_mask=self._mask)
        return _finish(res, want, return_lse, v_scale)

    forward = run

    def run_return_lse(self, q, paged_kv_cache, *args, **kw):
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kw)


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """Prefill over ragged (not paged) K/V: sequence b owns rows ``qo_indptr[b]:qo_indptr[b+1]`` of
    q and ``kv_indptr[b]:kv_indptr[b+1]`` of k / v."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf=None, kv_indptr_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend: str = "auto", jit_args=None,
                 jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, head_dim_vo: Optional[int] = None, custom_mask=None, packed_custom_mask=None,
             causal: bool = False, pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             window_left: int = -1, logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking: bool = True, **_ignored) -> None:
        self._plan_queries(qo_indptr, num_qo_heads, num_kv_heads, causal, pos_encoding_mode, sm_scale, head_dim_qk,
                           window_left, logits_soft_cap, rope_scale, rope_theta, head_dim_vo, custom_mask,
                           packed_custom_mask, extra=_ignored)
        kv_host = host_ints(kv_indptr, "kv_indptr")
        self._lens_kv = indptr_lengths(kv_host, "kv_indptr")
        if self._lens_kv.numel() != self._lens_q.numel():
            raise ValueError(f"qo_indptr: batch {self._lens_q.numel()} differs from kv_indptr's {self._lens_kv.numel()}")
        self._kv0, self._kv_end = int(kv_host[0]), int(kv_host[-1])
        self._cu_kv = keep_storage(self._slots, "kv_indptr", (kv_host - kv_host[0]).to(self._device, torch.int32),
                                   self._use_cuda_graph)
        self._max_kv = int(self._lens_kv.max()) if self._lens_kv.numel() else 0
        self._mask = _flat_mask(custom_mask, int((self._lens_q * self._lens_kv).sum()))
        self._pos = (_attend.positions(self._lens_q, self._lens_kv, self._device)
                     if self._opt.pos_encoding == "ROPE_LLAMA" else (None, None))
        self._planned = True

    begin_forward = plan

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, q_scale=None, k_scale=None,
            v_scale=None, out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, enable_pdl=None, window_left: Optional[int] = None, sinks=None,
            **_ignored):
        """``q [nnz_qo, Hq, D]``, ``k``/``v [nnz_kv, Hkv, D]`` (NHD) -> ``out [nnz_qo, Hq, D]``, or
        ``(out, lse [nnz_qo, Hq])`` (base-2)."""
        self._check_run(q)
        unsupported(sinks=sinks)
        require_tensor(k, "k", 3, "[nnz_kv, num_kv_heads, head_dim]")
        require_tensor(v, "v", 3, "[nnz_kv, num_kv_heads, head_dim]")
        check_dtypes(q, k)
        k, v = dense_kv(k, self._kv_layout), dense_kv(v, self._kv_layout)
        opt = _run_options(self._opt, q_scale, k_scale, window_left)
        want = bool(return_lse) or lse is not None
        k, v = k[self._kv0:self._kv_end], v[self._kv0:self._kv_end]
        res = _attend.ragged(q, k, v, self._cu_q, self._cu_kv, self._max_q, max(self._max_kv, 1), opt, out, lse,
                             want, q_pos=self._pos[0], k_pos=self._pos[1], custom_mask=self._mask)
        return _finish(res, want, return_lse, v_scale)

    forward = run

    def run_return_lse(self, q, k, v, *args, **kw):
        return self.run(q, k, v, *args, return_lse=True, **kw)
