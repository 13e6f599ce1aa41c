"""Expert parallelism: the experts of every sparse layer spread over the ranks of a stage, tokens
dispatched to the ranks holding their experts and the results combined with all-to-all.

Layout. With expert_parallel_size E the E ranks of a stage each hold num_experts / E experts (a
contiguous run) and a copy of the router and of Qwen2-MoE's shared expert. Attention and dense
MLP layers stay tensor-parallel over the same E ranks (sharding.py), not data-parallel: the
engine's scheduler and KV manager on rank 0 send one batch to all ranks, and tensor-parallel
attention keeps that one batch and one KV block space (each rank caching its heads, so KV capacity
grows with E), where data-parallel attention would need a batch split and a KV pool per rank
and would idle ranks whose share of the batch is short. Its cost is the all-reduce after o_proj.

A sparse layer on rank r (every rank holds the whole batch [T, H] after that all-reduce):
1. take token rows [r T/E, (r+1) T/E) (a contiguous slice, sizes differing by at most one) and
   route them (router -> top-k softmax) on this rank only;
2. dispatch: each token goes once to each rank holding at least one of its top-k experts, with its
   top-k ids and weights (one all-to-all of packed rows, after one of the row counts);
3. every rank runs its experts over what it received (fused_moe's expert_map drops the ids held
   elsewhere) and sends each row's partial sum back (the combine all-to-all);
4. the slice's rows add up their partial sums (+ the shared expert) and one all-gather gives every
   rank the whole batch again for the next layer's tensor-parallel attention.

Volume per sparse layer and rank, counted in EPStats: dispatch (H * dtype bytes + k * 8 bytes of ids
and weights) and combine (H * dtype bytes) per (token, remote rank holding one of its experts);
the all-gather moves each rank's slice, T / E rows. `expected_a2a_bytes` is the same count in
expectation under uniform routing, for planning."""
from __future__ import annotations

import math
from typing import Tuple

import torch

from ..layers.moe import MoE
from .comm import Comm


def token_slice(num_tokens: int, ep: int, r: int) -> Tuple[int, int]:
    """[start, end) of the token rows rank r routes."""
    base, extra = divmod(num_tokens, ep)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def expected_a2a_bytes(num_tokens: int, hidden: int, dtype_bytes: int, topk: int, num_experts: int, ep: int) -> float:
    """Expected all-to-all bytes (dispatch + combine, all ranks together) of one sparse layer when
    each token picks topk distinct experts uniformly: a token reaches each of the ep - 1 other
    ranks with probability 1 - C(E - E/ep, k) / C(E, k)."""
    local = num_experts // ep
    p_hit = 1.0 - math.comb(num_experts - local, topk) / math.comb(num_experts, topk)
    per_pair = 2 * hidden * dtype_bytes + 8 * topk
    return num_tokens * (ep - 1) * p_hit * per_pair


class EPStats:
    """This rank's sparse layers: routed tokens, (token, remote rank) pairs dispatched, and the
    all-to-all bytes (dispatch + combine) that routing implies, computed from the top-k ids; summed
    over ranks it equals the a2a_dispatch + a2a_combine bytes Comm measures at the calls."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.layer_calls = 0
        self.tokens_routed = 0
        self.remote_pairs = 0
        self.a2a_bytes_computed = 0

    def summary(self) -> dict:
        return {"layer_calls": self.layer_calls, "tokens_routed": self.tokens_routed,
                "remote_pairs": self.remote_pairs, "a2a_bytes_computed": self.a2a_bytes_computed}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[n, m] of any dtype -> its [n, m * itemsize] uint8 view."""
    return t.contiguous().view(torch.uint8).view(t.shape[0], t.shape[1] * t.element_size())


class ExpertParallel:
    def __init__(self, comm: Comm, ep: int):
        self.comm, self.ep = comm, ep
        self.rank = comm.tp_index
        self.stats = EPStats()

    def __call__(self, moe: MoE, x: torch.Tensor) -> torch.Tensor:
        """The sparse layer's output for every row of x [T, H] (the same x on every rank)."""
        T, H = x.shape
        ep, comm = self.ep, self.comm
        lo, hi = token_slice(T, ep, self.rank)
        xs = x[lo:hi]
        n, k = hi - lo, moe.top_k
        if n:
            weights, ids = moe.route(xs)
        else:  # fewer tokens than ranks: nothing to route here, but every collective still runs
            weights = torch.empty((0, k), dtype=torch.float32, device=x.device)
            ids = torch.empty((0, k), dtype=torch.int32, device=x.device)
        # which ranks each token needs: one copy per rank holding any of its experts
        hit = torch.zeros((n, ep), dtype=torch.bool, device=x.device)
        hit.scatter_(1, ids.long() // moe.num_local, True)
        _, rows = hit.t().nonzero(as_tuple=True)          # sorted by destination rank, then token
        send_counts = hit.sum(0)
        send = torch.cat([_as_bytes(xs.index_select(0, rows)), _as_bytes(ids.index_select(0, rows)),
                          _as_bytes(weights.index_select(0, rows))], dim=1)
        recv_counts = torch.empty_like(send_counts)
        comm.all_to_all(recv_counts, send_counts, [1] * ep, [1] * ep, "a2a_counts")
        s_splits, r_splits = send_counts.tolist(), recv_counts.tolist()
        recv = send.new_empty((sum(r_splits), send.shape[1]))
        comm.all_to_all(recv, send, r_splits, s_splits, "a2a_dispatch")

        row_bytes = H * x.element_size()
        rx = recv[:, :row_bytes].contiguous().view(x.dtype)
        rids = recv[:, row_bytes:row_bytes + 4 * k].contiguous().view(torch.int32)
        rw = recv[:, row_bytes + 4 * k:].contiguous().view(torch.float32)
        partial = moe.run_experts(rx, rw, rids) if rx.shape[0] else rx
        back = x.new_empty((len(rows), H))
        comm.all_to_all(back, partial, s_splits, r_splits, "a2a_combine")

        ys = torch.zeros((n, H), dtype=x.dtype, device=x.device)
        ys.index_add_(0, rows, back)
        if moe.shared is not None and n:
            ys.add_(moe.shared(xs))
        self._count(hit, row_bytes, send.shape[1])
        cap = -(-T // ep)  # all-gather needs equal sizes: pad every slice to the largest
        if n < cap:
            ys = torch.cat([ys, ys.new_zeros((cap - n, H))])
        full = comm.all_gather(ys)
        if T % ep == 0:
            return full
        return torch.cat([full[r * cap:r * cap + (b - a)] for r, (a, b) in
                          enumerate(token_slice(T, ep, r) for r in range(ep))])

    def _count(self, hit: torch.Tensor, row_bytes: int, packed_bytes: int) -> None:
        """From the routing alone: the pairs (token here, another rank holding one of its experts)
        each cost one packed row out and one result row back (all ranks' sums = the measured total)."""
        st = self.stats
        remote = int(hit.sum()) - int(hit[:, self.rank].sum())
        st.layer_calls += 1
        st.tokens_routed += hit.shape[0]
        st.remote_pairs += remote
        st.a2a_bytes_computed += remote * (packed_bytes + row_bytes)
