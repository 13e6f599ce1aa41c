"""FlashInfer-compatible kernels: ``import llmkern.compat.flashinfer as flashinfer`` in place of
``import flashinfer``. Follows FlashInfer 0.6.x: its sampling API (:mod:`.sampling`) and its
attention API (:mod:`.decode`, :mod:`.prefill`, :mod:`.page`, :mod:`.cascade`) with the same
names, parameters, defaults and returns, re-exported at top level as FlashInfer does.

Attention runs on llmkern's flash-attn-style kernels (CPU, CUDA; fp32 / fp16 / bf16; any page
size; NHD and HND layouts, one ``[num_pages, 2, ...]`` tensor or a ``(k, v)`` pair). Semantics are
FlashInfer's: causal masks bottom-right aligned, ``window_left``, ``logits_soft_cap``
(``cap * tanh(scaled score / cap)``), ``pos_encoding_mode`` NONE / ROPE_LLAMA / ALIBI, and lse in
base 2 (``log2 sum exp``), ``[tokens, heads]``, -inf for a query that sees no key.
``plan()`` works on the host (it may synchronise); ``run()`` only queues device work. Where
behaviour differs from FlashInfer's:

- Not supported (NotImplementedError): fp8 caches and q/kv of different dtypes, bit-packed
  custom masks (``packed_custom_mask``), multi-item scoring, ``head_dim_vo != head_dim_qk``
  (MLA), attention sinks. head_dim above 256 is beyond the kernels (ValueError).
- ``custom_mask`` (boolean) and ALIBI on a non-causal multi-query prefill run in fp32 torch
  (``_torch_path``), not the kernels, which cannot express them (FlashInfer's ALiBi bias is
  signed there, the kernels' is not). Same results, slower.
- ROPE_LLAMA is applied around the kernels: q and a gathered copy of the keys are rotated in
  fp32 and rounded once to the input dtype, so run() allocates that copy.
- The workspace buffers are accepted and unused; ``backend``, ``use_tensor_cores``,
  ``use_fp16_qk_reduction`` and the JIT arguments change nothing (except for multi-token
  decode, which takes FlashInfer's conditions on them).
"""
from . import cascade, decode, page, prefill, sampling
from .cascade import *  # noqa: F401,F403
from .decode import *  # noqa: F401,F403
from .page import *  # noqa: F401,F403
from .prefill import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403  (FlashInfer re-exports its ops at top level)

__version__ = "0.6.0"  # the FlashInfer release whose API this follows

__all__ = ["cascade", "decode", "page", "prefill", "sampling", *cascade.__all__, *decode.__all__,
           *page.__all__, *prefill.__all__, *sampling.__all__]
