"""Engine: the step loop (schedule -> run the model -> sample -> update), request intake and
abort, and run metrics. `LLM` drives it for offline batches; streaming callers use add_request /
step / abort directly."""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from ..models.loader import load_model
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .kv_cache_manager import KVCacheManager, build_kv_cache
from .kv_quant import kv_cache_quants
from .kv_handover import POLL_INTERVAL_S, KVHandover, admit_transfers
from .metrics import EngineStats, RunMetrics
from .cuda_graphs import DecodeGraphs
from .fault_isolation import FaultIsolation, copy_batch, is_fatal
from .faults import FaultInjector
from .model_runner import ModelRunner
from .parallel_runner import ParallelRunner, check_parallel, start_executor
from .output_processor import logprob_entries, make_output, request_metrics
from .outputs import RequestOutput
from .param_checks import logit_bias as check_logit_bias
from .prefill_tasks import prompt_logprobs
from .processor import PromptType, tokenize
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .stops import stop_reason
from .structured import StructuredOutputs
from .sequence import Request, Sequence


class _Launched(NamedTuple):
    """A step whose model run has started (with pipeline parallelism, possibly not finished)."""
    batch: object
    handle: object   # the runner's handle for finish(); None: the run happens when it completes
    t0: float


class _Computed(NamedTuple):
    """A step's results before any sequence advances."""
    sample_seqs: list
    tokens: list
    verified: dict
    logprobs: list   # (sequence, logprob entry) for those that asked


class Engine:
    def __init__(self, model=None, config: Optional[EngineConfig] = None, load_format: str = "auto",
                 tokenizer=None, model_obj=None):
        self.config = config = config or EngineConfig()
        device = config.torch_device
        self.executor = None
        if config.world_size > 1:  # the model split over T x P ranks; this process is rank 0
            check_parallel(config, model_obj)
            self.executor = start_executor(model, config, load_format)
            kv = self.executor.kv_spec  # KV block counts resolved for every rank
            self.config = config = dataclasses.replace(config, num_gpu_blocks=kv.num_gpu_blocks,
                                                       num_cpu_offload_blocks=kv.num_cpu_offload_blocks,
                                                       num_swap_blocks=kv.num_swap_blocks)
            self.model, self.tokenizer = self.executor.model, tokenizer or self.executor.tokenizer
            device = self.executor.device
            mc = self.executor.model_config  # the whole model's (self.model holds rank 0's shard)
        elif model_obj is not None:
            self.model, self.tokenizer = model_obj, tokenizer
            mc = self.model.config
        else:
            self.model, tok = load_model(model, config.torch_dtype, device, load_format, seed=config.seed,
                                         quantization=config.quantization)
            self.tokenizer = tokenizer or tok
            mc = self.model.config
        self.model_config = mc
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        self.eos_token_ids = list(mc.eos_token_ids or (self.tokenizer.eos_token_ids if self.tokenizer else []))
        if self.tokenizer is not None and self.tokenizer.eos_token_ids:
            self.eos_token_ids = sorted(set(self.eos_token_ids) | set(self.tokenizer.eos_token_ids))

        dtype = self.model.dtype
        self.sampler = Sampler(mc.vocab_size, self.eos_token_ids, device, config.seed)
        self.structured = StructuredOutputs(self.tokenizer, mc.vocab_size, self.eos_token_ids)
        self.spec = None
        kv_layers = [mc.kv_layout]
        if config.speculative is not None:
            from .spec_decode import SpecDecoder

            self.spec = SpecDecoder(config.speculative, self.model, device, dtype, self.max_model_len, self.sampler)
            kv_layers += self.spec.kv_layers()
        if self.executor is not None:  # rank 0's tiers; the other ranks replay the copies it logs
            self.kv = KVCacheManager.on_tiers(self.executor.kv, config.block_size, config.enable_prefix_caching)
            self.kv.copy_log = self.executor.copy_log
        else:
            self.kv = build_kv_cache(config, kv_layers, dtype, device, self.model,
                                     self._kv_quants(config))
        if self.spec is not None:
            self.spec.bind_caches(self.kv.caches, config.block_size)
        self.scheduler = Scheduler(config, self.kv, self.max_model_len)
        graphs = None
        if device.type == "cuda" and not config.enforce_eager and self.spec is None and self.executor is None:
            graphs = DecodeGraphs(self.model, self.kv.caches, config.block_size, config.max_num_seqs,
                                  self.max_model_len)
        if self.executor is not None:
            self.runner = ParallelRunner(self.executor, config.block_size)
        else:
            self.runner = ModelRunner(self.model, self.kv.caches, config.block_size, graphs)
        # Pipeline parallelism: up to `_depth` micro-batches in flight (oldest first); each holds
        # sequences the scheduler leaves alone until it completes. Speculation keeps one: its
        # drafts are proposed from tokens the step in flight has not produced yet.
        self.pipeline_depth = 1
        if self.executor is not None and self.executor.topo.pp > 1 and self.spec is None:
            self.pipeline_depth = config.pipeline_micro_batches or self.executor.topo.pp
        self._inflight: deque = deque()
        self.max_inflight = 0  # the most micro-batches seen in flight at once (a diagnostic)
        self.requests: Dict[str, Request] = {}
        self._ids = itertools.count()
        self._seq_ids = itertools.count()
        self._stream: Dict[str, bool] = {}
        self.metrics = RunMetrics()
        self.handover = self._make_handover(config) if config.kv_connector is not None else None
        self.faults = FaultInjector.from_env(self.tokenizer)   # None unless LLMKERN_FAULT_INJECT is set
        self._phase = "prepare"   # of the step's work in progress, for fault reports
        self.isolation = FaultIsolation(self._compute, lambda: self._phase, self._fail_request)

    def _kv_quants(self, config: EngineConfig):
        """A quantised KV cache's per-layer scales (calibrated on the model now), or None."""
        if config.kv_cache_dtype == "auto":
            return None
        return kv_cache_quants(config, self.model, self.tokenizer)

    def _make_handover(self, config: EngineConfig):
        """Prefill-decode hand-over (pd/): the connector, bound to this engine's cache."""
        if self.executor is not None:
            raise NotImplementedError("kv_connector: prefill-decode hand-over with tensor/pipeline parallelism "
                                      "is not supported")
        conn = config.kv_connector
        if isinstance(conn, dict):  # built here so a caller can pass a plain spec (CLI, server)
            from ..pd.factory import build_connector

            conn = build_connector(conn)
        return KVHandover(config.kv_role, conn, self.kv, config.kv_transfer_timeout_s, config.kv_transfer_fallback)

    def shutdown(self) -> None:
        """Release the worker processes of a model-parallel engine (no-op otherwise); idempotent."""
        self.structured.shutdown()   # the grammar-mask thread
        self.kv.close()              # the disk KV tier's writer
        if self.handover is not None:
            self.handover.close()
        if self.executor is not None:
            try:  # steps still in the pipeline finish first, so the workers stop between steps
                while self._inflight and not self.executor.closed:
                    self._complete(self._inflight.popleft())
            except Exception:
                pass  # the executor is down already; shutdown() below is a no-op then
            self.executor.shutdown()

    # -- intake ---------------------------------------------------------------------------------
    def tokenize(self, prompt: PromptType) -> Tuple[Optional[str], List[int]]:
        """(prompt text or None, token ids): see processor.tokenize."""
        return tokenize(prompt, self.tokenizer, self.model_config.vocab_size)

    def add_request(self, prompt: PromptType, params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None, stream: bool = False,
                    arrival_time: Optional[float] = None, priority: int = 0,
                    queue_deadline: Optional[float] = None, kv_transfer_params=None) -> str:
        """Validate and queue one request; raises ValueError/TypeError (and queues nothing) if it
        is bad. Returns its id. priority: lower runs first under policy "priority";
        queue_deadline: a time.perf_counter() value after which the request, if it has not
        started, finishes with finish_reason "timeout" and no output.
        kv_transfer_params: (decode side) a prefill engine's RequestOutput.kv_transfer_params:
        the request's prompt KV is received instead of computed, then it decodes from the
        prefill's first token on (see pd/interface.py). On a prefill engine (kv_role="prefill")
        every request is cut to its first token and its finished output carries
        kv_transfer_params."""
        params = params if params is not None else SamplingParams()
        pd = self.handover
        if kv_transfer_params is not None and (pd is None or pd.role == "prefill"):
            raise ValueError(f"kv_transfer_params: this engine (kv_role={self.config.kv_role!r}) does not take KV "
                             f"from a prefill engine")
        if pd is not None and pd.role == "prefill" and isinstance(params, SamplingParams):
            params = pd.prefill_params(params)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority: expected an integer, got {priority!r}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params: expected SamplingParams, got {type(params).__name__}")
        params.validate()   # again: a caller may have changed the fields since construction
        for name in ("logprobs", "prompt_logprobs", "structured_outputs"):
            if getattr(params, name) is not None and self.spec is not None:
                raise ValueError(f"{name}: not available with speculative decoding")
        if params.logit_bias:
            check_logit_bias(params.logit_bias, self.model_config.vocab_size)
        text, ids = self.tokenize(prompt)
        if not ids:
            raise ValueError("prompt: is empty (0 tokens)")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens, but the model allows at most {self.max_model_len - 1} "
                             f"(max_model_len {self.max_model_len}, leaving room for one output token)")
        total = len(ids) + (1 if params.max_tokens is None else params.max_tokens)
        need = -(-min(total, self.max_model_len) // self.config.block_size)
        if need > self.kv.num_blocks:
            raise ValueError(f"prompt: needs {need} KV blocks for {len(ids)} prompt + max_tokens tokens, but the KV "
                             f"pool has {self.kv.num_blocks}; lower max_tokens or raise kv_cache_memory_gb")
        kvp = None
        if kv_transfer_params is not None:
            kvp = pd.check_params(kv_transfer_params, ids, params)
        if request_id is None:
            request_id = str(next(self._ids))
        elif request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        req = Request(request_id, text, ids, params, arrival_time, priority, queue_deadline)
        for i in range(params.n):
            g = None
            if params.seed is not None:
                g = self.sampler.make_generator(params.seed if i == 0 else hash((params.seed, i)) & 0x7FFFFFFFFFFF)
            seq = Sequence(next(self._seq_ids), req, i, g)
            if self.tokenizer is not None and (stream or params.stop_list):
                seq.detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
            req.seqs.append(seq)
        self.structured.add(req)   # a grammar that does not compile is this request's ValueError
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = prompt_logprobs(self, ids, params.prompt_logprobs)
        self.requests[request_id] = req
        self._stream[request_id] = stream
        self.metrics.on_arrival()
        for seq in req.seqs:
            if kvp is not None:
                pd.add_loading(seq, kvp)   # waits for its KV, then runs
            else:
                self.kv.prefetch(seq)   # the disk KV tier reads ahead what it will look up
                self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request; its blocks are freed at once. Returns False for an unknown id."""
        req = self.requests.get(request_id)
        if req is None:  # a prefill engine's finished request may still hold blocks for its hand-over
            return self.handover.abort(request_id) if self.handover is not None else False
        now = time.perf_counter()
        for seq in req.seqs:
            if not seq.is_finished:
                self._finish(seq, "abort", now)
        return True

    def has_unfinished_requests(self) -> bool:
        """Requests to run, or steps in flight, or (prefill-decode) KV hand-overs in progress."""
        return (self.scheduler.has_work or bool(self._inflight)
                or (self.handover is not None and self.handover.has_work))

    def ready_in(self) -> float:
        """Seconds until step() has work (0: now; > 0: a dynamic batch is forming; inf: idle)."""
        if self._inflight:
            return 0.0  # a step in the pipeline waits to be completed
        wait = self.scheduler.ready_in(time.perf_counter())
        if self.handover is not None and self.handover.has_work:
            wait = min(wait, POLL_INTERVAL_S)  # transfers progress only when step() polls them
        return wait

    def stats(self) -> EngineStats:
        """A snapshot of the engine's load and counters (for a server's admission and metrics)."""
        sch, kv = self.scheduler, self.kv
        waiting = {s.request.request_id for s in sch.waiting}
        return EngineStats(
            num_running=len({s.request.request_id for s in sch.running} - waiting),
            num_waiting=len(waiting), num_swapped=len(sch.swapped),
            prefill_tokens_pending=sch.num_prefill_tokens_pending(),
            kv_blocks_total=kv.num_blocks, kv_blocks_free=kv.pool.num_free,
            num_preemptions=sch.num_preemptions, prefix_query_tokens=kv.stats.prefix_query_tokens,
            prefix_hit_tokens=kv.stats.prefix_hit_tokens,
            prompt_tokens_computed=self.metrics.prompt_tokens_computed,
            generation_tokens=self.metrics.generated_tokens, prefill_tok_s=self.metrics.prefill_tok_s,
            **kv.stats_fields(), **(self.handover.stats_fields() if self.handover is not None else {}))

    # -- the step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> List[RequestOutput]:
        """One scheduling + model step. Returns outputs of the requests that finished in it and,
        for streaming requests, of those that produced tokens."""
        spec = self.spec
        now = time.perf_counter()
        expired = self.scheduler.expired(now)
        for seq in expired:
            self._finish(seq, "timeout", now)
        handed = admit_transfers(self) if self.handover is not None else []
        if any(self._stream.get(s.request.request_id) for s in handed):
            return self._collect(handed)  # stream the prefill's first token now, not after a decode step
        if spec is not None:
            spec.before_schedule(self.scheduler.running)
        cap = self._micro_batch_seqs()
        batch = self.scheduler.schedule() if cap is None else self.scheduler.schedule(max_seqs=cap)
        if batch.empty:
            if self._inflight:  # everything runnable is in the pipeline: wait for the oldest step
                return self._collect(handed + self._complete(self._inflight.popleft()))
            if (self.scheduler.has_work and not self.scheduler.running and self.ready_in() == 0
                    and not (self.handover is not None and self.handover.has_work)):  # those free blocks later
                raise RuntimeError("engine: no request can be scheduled (KV pool too small for the queue head)")
            return self._collect(handed)
        if self.faults is not None:
            self.faults.delay()
        t0 = time.perf_counter()
        if self.pipeline_depth == 1:
            return self._collect(handed + self._complete(_Launched(batch, None, t0)))
        try:
            handle = self.runner.launch(self._prepare(batch))
        except Exception as e:  # noqa: BLE001 - fault isolation decides what it ends
            return self._collect(handed + self._recover(batch, e))
        self._inflight.append(_Launched(batch, handle, t0))
        self.scheduler.busy.update(s.seq_id for s in batch.decodes + batch.prefills)
        self.max_inflight = max(self.max_inflight, len(self._inflight))
        if len(self._inflight) < self.pipeline_depth:
            return self._collect(handed)
        return self._collect(handed + self._complete(self._inflight.popleft()))

    def _micro_batch_seqs(self) -> Optional[int]:
        """With P micro-batches in flight, each takes about 1/P of the sequences (else the first
        would take them all and leave the other stages idle)."""
        if self.pipeline_depth == 1:
            return None
        sch = self.scheduler
        n = len(sch.running) + len(sch.waiting) + len(sch.swapped)
        return max(1, -(-min(n, self.config.max_num_seqs) // self.pipeline_depth))

    def _complete(self, step: _Launched) -> List[Sequence]:
        """Finish a launched step: sample, advance the sequences, check stops. Returns the
        sequences that got tokens."""
        batch = step.batch
        if step.handle is not None:
            self.scheduler.busy.difference_update(s.seq_id for s in batch.decodes + batch.prefills)
        whole = copy_batch(batch) if self.spec is not None else batch   # verify() edits batch
        try:
            out = self._compute(batch, step.handle)
        except Exception as e:  # noqa: BLE001 - fault isolation decides what it ends
            return self._recover(whole, e)
        return self._advance(batch, out, step.t0)

    def _prepare(self, batch):
        """The model inputs of a batch (speculation: drafts proposed, the draft model mirrored)."""
        spec, faults = self.spec, self.faults
        self._phase = "prepare"
        if spec is not None:   # first: it settles which drafts the batch carries
            spec.before_forward(batch)
        if faults is not None:
            faults.check("prepare", batch.decodes + batch.prefills)
        inputs = self.runner.prepare(batch)
        self.structured.start(inputs.sample_seqs)   # the grammar masks fill while the model runs
        self._phase = "forward"
        if spec is not None:
            spec.mirror(inputs)
        if faults is not None:
            faults.check("forward", batch.decodes + batch.prefills)
        return inputs

    def _compute(self, batch, handle=None) -> _Computed:
        """The model run of a batch (or the end of a launched one), verification and sampling.
        No sequence advances, so fault isolation can re-run it for part of the batch."""
        spec = self.spec
        if handle is None:
            logits, sample_seqs = self.runner.execute(self._prepare(batch))
        else:
            self._phase = "forward"
            logits, sample_seqs = self.runner.finish(handle)
            if any(s.is_finished for s in sample_seqs):  # aborted while in flight: blocks freed already
                keep = [i for i, s in enumerate(sample_seqs) if not s.is_finished]
                logits, sample_seqs = logits[keep], [sample_seqs[i] for i in keep]
        if sample_seqs:   # (a prefill chunk that completes no prompt does not sample)
            self._phase = "sample"
        if self.faults is not None:
            self.faults.check("sample", sample_seqs)
        verified = {}
        if spec is not None:  # verified chunks leave the batch; their tokens are committed later
            logits, sample_seqs, verified = spec.verify(batch, logits, sample_seqs)
        lp_rows = [i for i, s in enumerate(sample_seqs) if s.logprobs is not None]
        # Log-probabilities of the model's distribution (before penalties and temperature, as
        # vLLM and OpenAI report them); taken before the sampler edits the logits in place.
        logp = torch.log_softmax(logits[lp_rows].float(), dim=-1) if lp_rows else None
        mask = self.structured.bitmask(sample_seqs, logits.device) if sample_seqs else None
        tokens = self.sampler(logits, sample_seqs, token_bitmask=mask) if sample_seqs else []
        lps = []
        if lp_rows:
            lp_seqs = [sample_seqs[i] for i in lp_rows]
            lps = list(zip(lp_seqs, logprob_entries(logp, lp_seqs, [tokens[i] for i in lp_rows])))
        return _Computed(sample_seqs, tokens, verified, lps)

    def _advance(self, batch, out: _Computed, t0: float) -> List[Sequence]:
        spec = self.spec
        for seq, entry in out.logprobs:
            seq.logprobs.append(entry)
        now = time.perf_counter()
        for seq in batch.decodes:
            if not seq.is_finished:
                seq.num_computed_tokens += 1
                self.kv.cache_blocks(seq)
        for seq, n in zip(batch.prefills, batch.prefill_lens):
            if not seq.is_finished:
                seq.num_computed_tokens += n
                self.kv.cache_blocks(seq)
        touched = []
        for seq, tok in zip(out.sample_seqs, out.tokens):
            if seq.is_finished:  # its request failed at a sibling's stop check (n > 1)
                continue
            seq.append_token(tok, now)
            self._check_stop(seq, tok, now)
            touched.append(seq)
        if out.verified:
            for seq in spec.commit(out.verified, now, self._check_stop):
                touched.append(seq)
                if not seq.is_finished:  # finished ones are freed already
                    self.kv.truncate(seq, seq.num_computed_tokens)  # the rejected drafts' slots
                    self.kv.cache_blocks(seq)
        self.metrics.on_step(batch, len(out.sample_seqs), now - t0)
        return touched

    def _recover(self, batch, error: Exception) -> List[Sequence]:
        """A step raised before advancing anything: fail the requests responsible (fault_isolation),
        or re-raise when the engine is broken. The rest of the batch runs again next step. Returns
        the sequences that steps still in the pipeline advanced (they complete first, so that the
        isolation's re-runs have the ranks to themselves)."""
        phase = self._phase
        if is_fatal(error) or (self.executor is not None and self.executor.closed):
            raise error
        touched = []
        while self._inflight:
            touched += self._complete(self._inflight.popleft())
        self.isolation.recover(batch, error, phase)
        for s in batch.decodes + batch.prefills:
            s.spec_token_ids = []   # scheduled again, with fresh drafts
        return touched

    def _fail_request(self, req: Request, message: str) -> None:
        """Finish a request with finish_reason "error" (its KV freed)."""
        req.error = message
        now = time.perf_counter()
        for seq in req.seqs:
            if not seq.is_finished:
                self._finish(seq, "error", now)

    def _check_stop(self, seq: Sequence, tok: int, now: float) -> None:
        """Detokenise and check the stops; a fault there fails the sequence's request only."""
        try:
            done = self.structured.advance(seq, tok)   # a complete grammar stops the sequence
            reason = stop_reason(seq, tok, self.eos_token_ids, self.max_model_len) or ("stop" if done else None)
            if reason is not None:
                self._finish(seq, reason, now)
        except Exception as e:  # noqa: BLE001 - fault isolation decides what it ends
            self.isolation.blame(seq.request, e, "stop check")

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finish_reason = reason
        seq.finish_time = now
        self.structured.drop(seq)
        pd = self.handover
        if pd is not None:
            if pd.role == "prefill" and reason in ("stop", "length") and seq.num_output_tokens:
                seq.request.kv_transfer_params = pd.on_prefill_finished(seq)  # pins its blocks
            else:
                pd.forget(seq)  # a request still waiting for its KV: stop the load first
        self.scheduler.finish(seq)
        if seq.stop_reason is None or not isinstance(seq.stop_reason, str):
            if self.tokenizer is not None and reason != "error":  # an error may come from decoding
                seq.output_text = self.tokenizer.decode(seq.output_token_ids, seq.params.skip_special_tokens)
        if seq.request.finished:
            self.metrics.on_finish(request_metrics(seq.request))

    def _collect(self, touched: List[Sequence]) -> List[RequestOutput]:
        out, seen = [], set()
        for req in list(self.requests.values()):
            rid = req.request_id
            fin = req.finished
            stream = self._stream.get(rid)
            if not fin and not (stream and any(s in touched for s in req.seqs)):
                continue
            if rid in seen:
                continue
            seen.add(rid)
            out.append(make_output(req, fin))
            if fin:
                del self.requests[rid]
                del self._stream[rid]
        return out

    def run_metrics(self) -> dict:
        out = self.metrics.summary(self.kv.stats, self.scheduler.num_preemptions)
        if self.spec is not None:
            out["speculative"] = self.spec.metrics.summary()
        return out
