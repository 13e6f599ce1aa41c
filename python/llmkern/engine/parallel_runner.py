"""The engine's runner when the model is split over several ranks (llmkern.distributed): inputs are
prepared on the host exactly as for one process and shipped to every rank; the logits come back
from the last pipeline stage."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .config import EngineConfig
from .model_runner import ModelRunner, StepInputs
from .scheduler import ScheduledBatch
from .sequence import Sequence


def start_executor(model, config: EngineConfig, load_format: str):
    """Start (or join) the model-parallel ranks for config's T x P split; this process is rank 0."""
    from ..distributed.executor import ParallelExecutor  # torch.distributed only when it is used

    return ParallelExecutor(model, config.parallel_spec(), config.kv_spec(), load_format)


def check_parallel(config: EngineConfig, model_obj) -> None:
    """What an engine split over ranks cannot take."""
    if model_obj is not None:
        raise ValueError("model_obj: a prebuilt model cannot be split over ranks; pass the model path "
                         "with tensor_parallel_size/pipeline_parallel_size")
    spec = config.speculative
    if spec is not None and spec.method != "ngram":
        raise NotImplementedError(f"speculative: method {spec.method!r} with tensor/pipeline parallelism is not "
                                  f"supported (ngram is)")


class ParallelRunner:
    def __init__(self, executor, block_size: int):
        self.executor = executor
        self._prep = ModelRunner(executor.model, executor.kv.caches, block_size)
        self._prep.device = torch.device("cpu")  # host tensors: they are pickled to the other ranks

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        return self._prep.prepare(batch)

    def execute(self, inputs: StepInputs) -> Tuple[Optional[torch.Tensor], List[Sequence]]:
        return self.finish(self.launch(inputs))

    def launch(self, inputs: StepInputs):
        """Start a step on every rank; with pipeline parallelism it returns once rank 0's stage is
        done, while the later stages work on."""
        return inputs, self.executor.launch(inputs.input_ids, inputs.positions, inputs.meta, inputs.sample_rows)

    def finish(self, handle) -> Tuple[Optional[torch.Tensor], List[Sequence]]:
        inputs, flight = handle
        logits = self.executor.finish(flight)
        if not inputs.sample_seqs:
            return None, []
        return logits, inputs.sample_seqs
