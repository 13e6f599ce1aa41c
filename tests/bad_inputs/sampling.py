import torch

import llmkern as lk

OPS = [
    "sampling_from_probs", "sampling_from_logits", "top_k_sampling_from_probs", "top_p_sampling_from_probs",
    "min_p_sampling_from_probs", "top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_probs",
    "top_k_mask_logits", "top_p_renorm_probs", "top_k_renorm_probs", "chain_speculative_sampling",
    "apply_penalties", "softmax",
]

_P = lambda: torch.softmax(torch.randn(3, 50), -1)  # noqa: E731
_L = lambda: torch.randn(3, 50)  # noqa: E731


def _nan():
    p = _P()
    p[1, 4] = float("nan")
    return p


def _inf_logits():
    x = _L()
    x[0, 1] = float("inf")
    return x


_TP = lambda: torch.softmax(torch.randn(2, 3, 50), -1)  # noqa: E731
_DP = lambda: torch.softmax(torch.randn(2, 2, 50), -1)  # noqa: E731
_ID = lambda: torch.randint(0, 50, (2, 2))  # noqa: E731
spec = lk.chain_speculative_sampling

CASES = [
    ("probs-rank", lambda: lk.sampling_from_probs(torch.rand(50)), ValueError, "probs"),
    ("probs-int", lambda: lk.sampling_from_probs(torch.ones(2, 5, dtype=torch.int32)), TypeError, "probs"),
    ("probs-not-tensor", lambda: lk.sampling_from_probs([[0.5, 0.5]]), TypeError, "probs"),
    ("probs-empty-vocab", lambda: lk.sampling_from_probs(torch.zeros(2, 0)), ValueError, "probs"),
    ("probs-noncontig", lambda: lk.sampling_from_probs(_P().t()), ValueError, "probs"),
    ("probs-nan-check", lambda: lk.sampling_from_probs(_nan(), check_nan=True), ValueError, "probs"),
    ("logits-inf-check", lambda: lk.sampling_from_logits(_inf_logits(), check_nan=True), ValueError, "logits"),
    ("logits-rank", lambda: lk.top_k_top_p_sampling_from_logits(torch.randn(2, 3, 4), 2, 0.5), ValueError, "logits"),
    ("top-p-negative", lambda: lk.top_p_sampling_from_probs(_P(), -0.1), ValueError, "top_p"),
    ("top-p-above-one", lambda: lk.top_p_sampling_from_probs(_P(), 1.5), ValueError, "top_p"),
    ("top-p-tensor-entry", lambda: lk.top_p_sampling_from_probs(_P(), torch.tensor([0.5, 1.5, 0.9])), ValueError, "top_p"),
    ("top-p-tensor-len", lambda: lk.top_p_sampling_from_probs(_P(), torch.tensor([0.5, 0.9])), ValueError, "top_p"),
    ("top-p-bool-tensor", lambda: lk.top_p_sampling_from_probs(_P(), torch.tensor([True, True, True])), TypeError, "top_p"),
    ("top-p-str", lambda: lk.top_p_sampling_from_probs(_P(), "0.5"), TypeError, "top_p"),
    ("top-k-negative", lambda: lk.top_k_sampling_from_probs(_P(), -1), ValueError, "top_k"),
    ("top-k-above-vocab", lambda: lk.top_k_sampling_from_probs(_P(), 51), ValueError, "top_k"),
    ("top-k-tensor-entry", lambda: lk.top_k_sampling_from_probs(_P(), torch.tensor([1, 99, 2])), ValueError, "top_k"),
    ("top-k-float-tensor", lambda: lk.top_k_sampling_from_probs(_P(), torch.tensor([1.0, 2.0, 3.0])), TypeError, "top_k"),
    ("top-k-fraction", lambda: lk.top_k_sampling_from_probs(_P(), 2.5), ValueError, "top_k"),
    ("min-p-above-one", lambda: lk.min_p_sampling_from_probs(_P(), 1.5), ValueError, "min_p"),
    ("min-p-negative", lambda: lk.min_p_sampling_from_probs(_P(), -0.1), ValueError, "min_p"),
    ("temperature-negative", lambda: lk.sampling_from_logits(_L(), temperature=-1.0), ValueError, "temperature"),
    ("temperature-nan", lambda: lk.sampling_from_logits(_L(), temperature=float("nan")), ValueError, "temperature"),
    ("order", lambda: lk.top_k_top_p_sampling_from_probs(_P(), 2, 0.5, filter_apply_order="p_first"), ValueError, "filter_apply_order"),
    ("indices-range", lambda: lk.sampling_from_probs(_P(), indices=torch.tensor([0, 3])), ValueError, "indices"),
    ("indices-negative", lambda: lk.sampling_from_probs(_P(), indices=torch.tensor([-1])), ValueError, "indices"),
    ("indices-dtype", lambda: lk.sampling_from_probs(_P(), indices=torch.tensor([0.0])), TypeError, "indices"),
    ("indices-rank", lambda: lk.sampling_from_probs(_P(), indices=torch.zeros(2, 2, dtype=torch.long)), ValueError, "indices"),
    ("seed-float", lambda: lk.sampling_from_probs(_P(), seed=1.5, offset=0), TypeError, "seed"),
    ("offset-tensor-dtype", lambda: lk.sampling_from_probs(_P(), seed=1, offset=torch.tensor([1.0])), TypeError, "offset"),
    ("seed-tensor-len", lambda: lk.sampling_from_probs(_P(), seed=torch.tensor([1, 2]), offset=0), ValueError, "seed"),
    ("renorm-top-k", lambda: lk.top_k_renorm_probs(_P(), 51), ValueError, "top_k"),
    ("renorm-top-p", lambda: lk.top_p_renorm_probs(_P(), 1.01), ValueError, "top_p"),
    ("renorm-rank", lambda: lk.top_p_renorm_probs(torch.rand(2, 3, 4), 0.5), ValueError, "probs"),
    ("mask-top-k", lambda: lk.top_k_mask_logits(_L(), -2), ValueError, "top_k"),
    ("mask-dtype", lambda: lk.top_k_mask_logits(torch.ones(2, 4, dtype=torch.int64), 1), TypeError, "logits"),
    ("spec-target-rank", lambda: spec(_DP(), _ID(), torch.rand(2, 50)), ValueError, "target_probs"),
    ("spec-target-dtype", lambda: spec(_DP(), _ID(), _TP().half()), TypeError, "target_probs"),
    ("spec-ids-shape", lambda: spec(_DP(), torch.randint(0, 50, (2, 3)), _TP()), ValueError, "draft_token_ids"),
    ("spec-ids-range", lambda: spec(_DP(), torch.full((2, 2), 50), _TP()), ValueError, "draft_token_ids"),
    ("spec-ids-dtype", lambda: spec(_DP(), _ID().float(), _TP()), TypeError, "draft_token_ids"),
    ("spec-draft-shape", lambda: spec(torch.rand(2, 2, 49), _ID(), _TP()), ValueError, "draft_probs"),
    ("spec-counter-shape", lambda: spec(_DP(), _ID(), _TP(), torch.zeros(3, dtype=torch.int32)), ValueError, "maybe_output_accepted_token_num"),
    ("spec-not-tensor", lambda: spec(_DP(), [[1, 2], [3, 4]], _TP()), TypeError, "draft_token_ids"),
    ("pen-repetition", lambda: lk.apply_penalties(_L(), torch.zeros(3, 50, dtype=torch.long), 0.0), ValueError, "repetition_penalties"),
    ("pen-frequency-nan", lambda: lk.apply_penalties(_L(), None, 1.0, float("nan")), ValueError, "frequency_penalties"),
    ("pen-counts-shape", lambda: lk.apply_penalties(_L(), torch.zeros(3, 49, dtype=torch.long)), ValueError, "output_token_counts"),
    ("pen-both-outputs", lambda: lk.apply_penalties(_L(), torch.zeros(3, 50, dtype=torch.long), output_token_ids=torch.zeros(3, 2, dtype=torch.long)), ValueError, "output_token_ids"),
    ("pen-ids-range", lambda: lk.apply_penalties(_L(), output_token_ids=torch.full((3, 2), 51)), ValueError, "output_token_ids"),
    ("pen-prompt-mask-dtype", lambda: lk.apply_penalties(_L(), prompt_mask=torch.zeros(3, 50)), TypeError, "prompt_mask"),
    ("pen-presence-len", lambda: lk.apply_penalties(_L(), None, 1.0, 0.0, torch.tensor([0.1, 0.2])), ValueError, "presence_penalties"),
    ("pen-int-logits", lambda: lk.apply_penalties(torch.zeros(3, 50, dtype=torch.long)), TypeError, "logits"),
    ("softmax-int-logits", lambda: lk.softmax(torch.zeros(3, 50, dtype=torch.long)), TypeError, "logits"),
    ("softmax-rank", lambda: lk.softmax(torch.randn(2, 3, 4)), ValueError, "logits"),
    ("softmax-temperature-negative", lambda: lk.softmax(_L(), -0.5), ValueError, "temperature"),
    ("softmax-temperature-len", lambda: lk.softmax(_L(), torch.tensor([1.0, 2.0])), ValueError, "temperature"),
    ("softmax-temperature-str", lambda: lk.softmax(_L(), "hot"), TypeError, "temperature"),
]
