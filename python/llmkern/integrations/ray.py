"""Ray Data integration: many engines, one per Ray actor, for jobs that outgrow one machine.

`LLMPredictor` is a callable class for `Dataset.map_batches`: each actor builds one engine in its
constructor and turns batches of rows into results (tokenisation happens in the actor). Recipe:

    import ray
    from llmkern.integrations.ray import LLMPredictor

    ray.init()                                    # or ray.init(address="auto") on a cluster
    ds = ray.data.read_json("prompts.jsonl")      # or read_parquet(...): one row per prompt
    ds = ds.map_batches(LLMPredictor, batch_size=64, num_cpus=1,
                        compute=ray.data.ActorPoolStrategy(size=4),   # 4 engines, one per actor
                        fn_constructor_kwargs=dict(task="generate", sampling={"max_tokens": 64, "temperature": 0},
                                                   engine_kwargs={"schedule": "throughput"}))
    ds.write_parquet("results/")                  # or write_json(...)

Rows are JSON objects like the lines of `llmkern generate --input` ("prompt" | "messages" |
"prompt_token_ids", optional "id" and sampling fields) or of `llmkern embed` ("input" | ...). Output
columns: the input's "id" (as JSON) and "line" when present, "record" (the JSON record the CLI
writes), "error" (None when fine), plus "text" / "finish_reason" (generate) or "embedding" (embed).
`run_on_ray` is what `llmkern generate|embed --ray` use."""
from __future__ import annotations

import json
import logging
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..offline.jsonl import Item, record_key
from ..offline.tasks import EmbedTask, GenerateTask, error_record

_META = ("line", "key", "json")  # columns run_on_ray adds; not part of a request


def _py(v: Any) -> Any:
    """numpy values from Arrow batches -> plain Python (lists of ints stay lists)."""
    if isinstance(v, np.ndarray):
        return [_py(x) for x in v.tolist()] if v.dtype == object else v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_py(x) for x in v]
    if isinstance(v, dict):
        return {k: _py(x) for k, x in v.items() if x is not None}
    return v


class LLMPredictor:
    """One llmkern engine per Ray actor; `__call__(batch)` runs a batch of rows to completion."""

    def __init__(self, task="generate", model: Optional[str] = None, load_format: str = "auto",
                 sampling: Optional[dict] = None, chat: bool = True, pooling: str = "mean", normalize: bool = True,
                 engine_kwargs: Optional[dict] = None):
        from ..engine import LLM

        if isinstance(task, str):
            if task not in ("generate", "embed"):
                raise ValueError(f"task: expected 'generate' or 'embed', got {task!r}")
            task = GenerateTask(sampling, chat) if task == "generate" else EmbedTask(pooling, normalize)
        self.task = task
        self.llm = LLM(model, load_format=load_format, **dict(engine_kwargs or {}))

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, list]:
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        items: List[Item] = []
        for i in range(n):
            row = {c: _py(batch[c][i]) for c in cols}
            if row.get("json"):
                obj = json.loads(row["json"])
            else:
                obj = {k: v for k, v in row.items() if k not in _META and v is not None}
            line = int(row["line"]) if row.get("line") is not None else i + 1
            ident = obj.get("id") if isinstance(obj, dict) else None
            items.append(Item(line, row.get("key") or record_key(ident, line), obj))
        recs: Dict[int, dict] = {}
        self.task.run(self.llm, items, lambda it, rec: recs.__setitem__(id(it), rec))
        out: Dict[str, list] = {"line": [], "key": [], "id": [], "record": [], "error": []}
        extra = ("text", "finish_reason") if isinstance(self.task, GenerateTask) else ("embedding",)
        for k in extra:
            out[k] = []
        for it in items:  # the batch's own order
            rec = recs[id(it)]
            out["line"].append(it.line)
            out["key"].append(it.key)
            out["id"].append(json.dumps(rec["id"]) if rec.get("id") is not None else None)
            out["record"].append(json.dumps({k: v for k, v in rec.items() if v is not None}, ensure_ascii=False))
            out["error"].append(rec.get("error"))
            for k in extra:
                out[k].append(rec.get(k))
        return out


def run_on_ray(task, items: List[Item], emit: Callable[[Item, dict], None], *, model: Optional[str] = None,
               load_format: str = "auto", engine_kwargs: Optional[dict] = None, address: Optional[str] = None,
               num_actors: int = 1, batch_size: int = 64, num_cpus: float = 1.0, num_gpus: float = 0.0,
               progress: bool = True) -> None:
    """Run items through `num_actors` engines on Ray Data and emit each record as it comes back.
    Connects to `address` (a running cluster) or starts a local Ray; a Ray started here is shut down."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray: Ray is not installed (pip install 'llmkern[ray]')") from None
    by_key = {}
    rows = []
    for it in items:
        if it.error is not None:  # unreadable lines never leave the driver
            emit(it, error_record(it, it.error))
            continue
        by_key[it.key] = it
        rows.append({"line": it.line, "key": it.key, "json": json.dumps(it.obj)})
    if not rows:
        return
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 **({"num_cpus": max(int(num_cpus * num_actors), 1)} if address is None else {}))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress  # Ray's per-operator progress (the driver shows lines done too)
    logging.getLogger("ray.data").setLevel(logging.INFO if progress else logging.WARNING)
    try:
        ds = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // batch_size)))
        ds = ds.map_batches(LLMPredictor, batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=num_actors),
                            num_cpus=num_cpus,
                            num_gpus=num_gpus, fn_constructor_kwargs=dict(
                                task=task, model=model, load_format=load_format, engine_kwargs=engine_kwargs))
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="default"):
                for key, rec in zip(batch["key"], batch["record"]):
                    emit(by_key[str(key)], json.loads(rec))
        except ray.exceptions.RayError as e:  # e.g. an actor could not load the model
            from ..offline.results import JobError

            raise JobError(f"--ray: the Ray job failed: {str(e).strip().splitlines()[-1]}") from None
    finally:
        if started:
            ray.shutdown()
