"""Tensor, pipeline and data parallelism in the estimate: what one rank of a split computes and
sends, and the splits of N devices worth trying.

A split (tp, pp, dp) runs dp replicas, each over tp x pp devices:
- tensor parallel (Megatron): every matmul's weights and the attention heads are divided by tp
  (KV heads too, replicated once tp exceeds them), the LM head by vocabulary; two all-reduces of
  the step's activations per layer (after the attention output and the MLP down projection).
- pipeline parallel: each stage holds layers / pp (the last one the LM head); llmkern splits the
  running sequences into up to pp micro-batches that follow each other through the stages, so a
  round in which every sequence advances once takes pp stage slots: in steady state the stages
  work on different micro-batches at once, and a single sequence crosses them one after another.
  Activations go from stage to stage once per micro-batch.
- data parallel: replicas share nothing; each takes 1/dp of the requests.

Collectives: a ring all-reduce of B bytes over n ranks moves 2 (n - 1) / n x B per rank in
2 (n - 1) steps, each paying the link latency; a stage hand-over is one send."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Split:
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp}"

    def invalid(self, heads: int, kv_heads: int, layers: int) -> Optional[str]:
        """Why llmkern cannot run this split of such a model, or None."""
        if min(self.tp, self.pp, self.dp) < 1:
            return "every size must be >= 1"
        if heads % self.tp:
            return f"tp={self.tp} does not divide the {heads} attention heads"
        if kv_heads % self.tp and self.tp % kv_heads:
            return f"tp={self.tp} and the {kv_heads} KV heads: neither divides the other"
        if self.pp > layers:
            return f"pp={self.pp} exceeds the {layers} layers"
        return None


ONE = Split()


def kv_fraction(kv_heads: int, tp: int) -> float:
    """Share of the KV heads one tensor-parallel rank holds (one whole head once tp exceeds them)."""
    return max(1, kv_heads // tp) / kv_heads


def allreduce_time(nbytes: float, ranks: int, link_bw: float, link_latency_s: float) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / link_bw + 2 * (ranks - 1) * link_latency_s


def send_time(nbytes: float, link_bw: float, link_latency_s: float) -> float:
    return nbytes / link_bw + link_latency_s if nbytes > 0 else 0.0


def splits(num_devices: int, heads: int, kv_heads: int, layers: int) -> List[Split]:
    """Every split of num_devices that llmkern can run for such a model, tp-major."""
    if num_devices < 1:
        raise ValueError(f"--num-gpus: expected an integer >= 1, got {num_devices}")
    out = []
    for tp in range(1, num_devices + 1):
        if num_devices % tp:
            continue
        rest = num_devices // tp
        for pp in range(1, rest + 1):
            s = Split(tp, pp, rest // pp)
            if rest % pp == 0 and s.invalid(heads, kv_heads, layers) is None:
                out.append(s)
    return out
