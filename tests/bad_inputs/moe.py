import torch

import llmkern
from llmkern.ops.moe import MoEWeights

OPS = ["topk_softmax", "moe_align_block_size", "fused_moe", "pack_moe_weights", "MoEWeights"]
T, E, H, I = 4, 3, 16, 8
x = torch.randn(T, H)
w13 = torch.randn(E, 2 * I, H)
w2 = torch.randn(E, H, I)
w = torch.full((T, 2), 0.5)
ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 2]], dtype=torch.int32)
buf = torch.randn(T + 1, H)
bad = ids.clone()
bad[0, 0] = 3
P = llmkern.pack_moe_weights(w13, w2)
PB = llmkern.pack_moe_weights(w13.bfloat16(), w2.bfloat16())
xb = x.bfloat16()
f = llmkern.fused_moe


def emap(*v):
    return torch.tensor(v, dtype=torch.int32)


CASES = [
    ("topk-k", lambda: llmkern.topk_softmax(torch.randn(4, 3), 4), ValueError, "topk"),
    ("topk-k-zero", lambda: llmkern.topk_softmax(torch.randn(4, 3), 0), ValueError, "topk"),
    ("topk-k-float", lambda: llmkern.topk_softmax(torch.randn(4, 3), 1.0), TypeError, "topk"),
    ("topk-rank", lambda: llmkern.topk_softmax(torch.randn(4), 1), ValueError, "gating_output"),
    ("topk-int", lambda: llmkern.topk_softmax(torch.ones(4, 3, dtype=torch.int32), 1), TypeError, "gating_output"),
    ("topk-renorm", lambda: llmkern.topk_softmax(torch.randn(4, 3), 1, "yes"), TypeError, "renormalize"),
    ("align-range", lambda: llmkern.moe_align_block_size(bad, E, 4), ValueError, "topk_ids"),
    ("align-negative", lambda: llmkern.moe_align_block_size(ids - 2, E, 4), ValueError, "topk_ids"),
    ("align-block", lambda: llmkern.moe_align_block_size(ids, E, 0), ValueError, "block_size"),
    ("align-experts", lambda: llmkern.moe_align_block_size(ids, 0, 4), ValueError, "num_experts"),
    ("align-float", lambda: llmkern.moe_align_block_size(ids.float(), E, 4), TypeError, "topk_ids"),
    ("align-rank", lambda: llmkern.moe_align_block_size(ids.view(-1), E, 4), ValueError, "topk_ids"),
    ("moe-ids-range", lambda: f(x, w13, w2, w, bad), ValueError, "topk_ids"),
    ("moe-ids-float", lambda: f(x, w13, w2, w, ids.float()), TypeError, "topk_ids"),
    ("moe-w2-shape", lambda: f(x, w13, w2[:, :, :4], w, ids), ValueError, "w2"),
    ("moe-w13-odd", lambda: f(x, w13[:, :7], w2, w, ids), ValueError, "w13"),
    ("moe-w13-rank", lambda: f(x, w13[0], w2, w, ids), ValueError, "w13"),
    ("moe-hidden", lambda: f(x[:, :8], w13, w2, w, ids), ValueError, "hidden_states"),
    ("moe-hidden-rank", lambda: f(x[0], w13, w2, w, ids), ValueError, "hidden_states"),
    ("moe-dtype", lambda: f(x, w13.half(), w2.half(), w, ids), TypeError, "w13"),
    ("moe-int", lambda: f(x.int(), w13.int(), w2.int(), w, ids), TypeError, "hidden_states"),
    ("moe-noncontig-w", lambda: f(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, w, ids), ValueError, "w13"),
    ("moe-weights-rows", lambda: f(x, w13, w2, w[:3], ids), ValueError, "topk_weights"),
    ("moe-weights-k", lambda: f(x, w13, w2, w, ids[:, :1]), ValueError, "topk_weights"),
    ("moe-weights-int", lambda: f(x, w13, w2, ids, ids), TypeError, "topk_weights"),
    ("moe-ids-rows", lambda: f(x, w13, w2, w[:3], ids[:3]), ValueError, "topk_ids"),
    ("moe-activation", lambda: f(x, w13, w2, w, ids, activation="gelu"), ValueError, "activation"),
    ("moe-out-shape", lambda: f(x, w13, w2, w, ids, out=torch.empty(T, H + 1)), ValueError, "out"),
    ("moe-out-dtype", lambda: f(x, w13, w2, w, ids, out=torch.empty(T, H).half()), TypeError, "out"),
    ("moe-out-overlap", lambda: f(buf[:-1], w13, w2, w, ids, out=buf[1:]), ValueError, "hidden_states"),
    ("moe-out-weights", lambda: f(x, w13, w2, w, ids, out=w13.view(-1)[:T * H].view(T, H)), ValueError, "w13"),
    ("moe-packed-out-overlap", lambda: f(buf[:-1], P, None, w, ids, out=buf[1:]), ValueError, "hidden_states"),
    ("moe-map-range", lambda: f(x, w13, w2, w, ids, expert_map=emap(0, 5, 1)), ValueError, "expert_map"),
    ("moe-map-short", lambda: f(x, w13, w2, w, ids, expert_map=emap(0, 1)), ValueError, "topk_ids"),
    ("moe-map-float", lambda: f(x, w13, w2, w, ids, expert_map=torch.zeros(3)), TypeError, "expert_map"),
    ("moe-not-tensor", lambda: f(x, "w13", w2, w, ids), TypeError, "w13"),
    ("moe-packed-w2", lambda: f(x, P, w2, w, ids), ValueError, "w2"),
    ("moe-packed-hidden", lambda: f(x[:, :8], P, None, w, ids), ValueError, "hidden_states"),
    ("moe-packed-ids", lambda: f(x, P, None, w, bad), ValueError, "topk_ids"),
    ("moeweights-bad-panels", lambda: f(x, MoEWeights(P.w13[:, :, :8], P.w2, E, H, I), None, w, ids), ValueError, "w13"),
    ("moeweights-dtype", lambda: f(x, MoEWeights(P.w13.double(), P.w2, E, H, I), None, w, ids), TypeError, "w13"),
    ("moe-bf16-packed-fp32-hidden", lambda: f(x, PB, None, w, ids), ValueError, "hidden_states"),
    ("moe-bf16-packed-w2-shape", lambda: f(xb, MoEWeights(PB.w13, PB.w2[:, :, :2], E, H, I), None, w, ids), ValueError, "w2"),
    ("moe-bf16-packed-w13-rank", lambda: f(xb, MoEWeights(PB.w13[0], PB.w2, E, H, I), None, w, ids), ValueError, "w13"),
    ("moe-bf16-packed-mixed", lambda: f(xb, MoEWeights(PB.w13, P.w2, E, H, I), None, w, ids), ValueError, "w2"),
    ("pack-dtype", lambda: llmkern.pack_moe_weights(w13, w2, dtype=torch.float16), ValueError, "dtype"),
    ("pack-rank", lambda: llmkern.pack_moe_weights(w13[0], w2), ValueError, "w13"),
    ("pack-w2", lambda: llmkern.pack_moe_weights(w13, w2[:2]), ValueError, "w2"),
    ("pack-int", lambda: llmkern.pack_moe_weights(w13.int(), w2.int()), TypeError, "w13"),
    # int64 ids past int32 are refused, never narrowed (2**32 + 1 would become expert 1)
    ("align-ids-int64-wrap", lambda: llmkern.moe_align_block_size(ids.long() + 2**32, E, 4), ValueError, "topk_ids"),
    ("moe-ids-int64-wrap", lambda: f(x, w13, w2, w, ids.long() + 2**32), ValueError, "topk_ids"),
    ("moe-packed-ids-int64-wrap", lambda: f(x, P, None, w, ids.long() - 2**32), ValueError, "topk_ids"),
    ("moe-map-int64-wrap", lambda: f(x, w13, w2, w, ids, expert_map=emap(0, 1, 2).long() + 2**32), ValueError,
     "expert_map"),
]
