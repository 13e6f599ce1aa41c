// Mixture-of-experts kernels (vLLM's fused-MoE semantics): router top-k over a softmax, grouping of
// the (token, expert) pairs by expert, and the expert MLPs with their weighted sum back in token
// order. Row math both backends share is in moe_math.h.
#pragma once
#include <cstdint>
#include <optional>

#include "common/dispatch.h"
#include "common/tensor.h"

// gating [T, E] float; weights fp32 [T, k], ids int32 [T, k] (contiguous).
LLMK_DECLARE_KERNEL(topk_softmax, (const TensorView& weights, const TensorView& ids, const TensorView& gating,
                                   bool renormalize, int64_t stream))

// topk_ids int32 [T, k] (contiguous); expert_map int32 [global E] or null (global id -> local row,
// -1 = not local); outputs as ops/moe.py's moe_align_block_size documents them.
LLMK_DECLARE_KERNEL(moe_align_block_size, (const TensorView& topk_ids, const TensorView* expert_map,
                                           int64_t num_experts, int64_t block_size, const TensorView& sorted_ids,
                                           const TensorView& expert_ids, const TensorView& num_post_pad,
                                           int64_t stream))

// out [T, H] = sum_j w[t,j] * w2[e] (silu(w13[e,:I] x[t]) * w13[e,I:] x[t]); x/out/w13/w2 one float
// dtype, topk_weights fp32 [T, k], topk_ids int32 [T, k], expert_map int32 or null. workspace: the
// CUDA kernels' intermediates (fused_moe_workspace_bytes), unused on CPU.
LLMK_DECLARE_KERNEL(fused_moe, (const TensorView& out, const TensorView& x, const TensorView& w13,
                                const TensorView& w2, const TensorView& topk_weights, const TensorView& topk_ids,
                                const TensorView* expert_map, const TensorView* workspace, int64_t stream))

// The same on experts packed for the CPU GEMM (csrc/linear/gemm_cpu.h panels), any float x/out:
// w13_packed [E, ceil(2I/16), H, 16], w2_packed [E, ceil(H/16), I, 16].
LLMK_DECLARE_KERNEL(fused_moe_packed, (const TensorView& out, const TensorView& x, const TensorView& w13_packed,
                                       const TensorView& w2_packed, int64_t inter, const TensorView& topk_weights,
                                       const TensorView& topk_ids, const TensorView* expert_map, int64_t stream))

namespace llmk {

// Bytes of the CUDA fused_moe workspace: grouped pair ids, block experts, activations, per-pair
// outputs (layout in moe.cu).
int64_t fused_moe_workspace_bytes(int64_t num_pairs, int64_t num_experts, int64_t hidden, int64_t inter,
                                  int64_t elem_bytes);

void topk_softmax(TensorView weights, TensorView ids, TensorView gating, bool renormalize, int64_t stream);
void moe_align_block_size(TensorView topk_ids, int64_t num_experts, int64_t block_size, TensorView sorted_ids,
                          TensorView expert_ids, TensorView num_post_pad, int64_t stream);
void fused_moe(TensorView out, TensorView x, TensorView w13, TensorView w2, TensorView topk_weights,
               TensorView topk_ids, std::optional<TensorView> expert_map, std::optional<TensorView> workspace,
               int64_t stream);
void fused_moe_packed(TensorView out, TensorView x, TensorView w13_packed, TensorView w2_packed, int64_t inter,
                      TensorView topk_weights, TensorView topk_ids, std::optional<TensorView> expert_map,
                      int64_t stream);

}  // namespace llmk
