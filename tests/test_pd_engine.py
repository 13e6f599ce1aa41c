"""Prefill-decode disaggregation, engine side: a prefill engine computes the prompt and the first
token, its KV blocks travel to a decode engine (shared memory in one process; torch.distributed
point-to-point between two processes on loopback), which continues the request.

References: a co-located engine on the same dummy weights (greedy tokens identical, which also
checks that every received KV byte is right), the KV byte count from the model's shape, and the
block pools' free counts before any request. Failure cases end with a clear error, no hang and
every block back in its pool."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")

import torch
import torch.distributed as dist

import llmkern
from llmkern.engine import Engine, EngineConfig, SamplingParams

MODEL = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
             max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
BS = 4
# K and V, every layer, fp32: the size of one KV block, from the model's shape alone
BLOCK_BYTES = 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * (64 // 4) * BS * 4
ENGINE = dict(block_size=BS, num_gpu_blocks=48, seed=0)
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = [[3 + (7 * i + 5 * j) % 250 for j in range(n)] for i, n in enumerate((5, 8, 13, 2))]
PEER = os.path.join(os.path.dirname(__file__), "pd_peer.py")
WAIT_S = 30.0  # upper bound of every loop below (they end far sooner unless something is broken)


@pytest.fixture(autouse=True)
def one_thread():
    saved = torch.get_num_threads(), llmkern.get_num_threads()
    torch.set_num_threads(1)
    llmkern.set_num_threads(1)
    yield
    torch.set_num_threads(saved[0])
    llmkern.set_num_threads(saved[1])


def new_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def engine(role="both", spec=None, **kw) -> Engine:
    return Engine(MODEL, EngineConfig(kv_role=role, kv_connector=spec, **dict(ENGINE, **kw)), load_format="dummy")


def kv_blocks(n_tokens: int) -> int:
    return -(-n_tokens // BS)


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens of a co-located engine for PROMPTS (and any other prompt, on demand)."""
    eng = engine()
    cache = {}

    def ref(prompt, params=GREEDY):
        key = (tuple(prompt), params.max_tokens)
        if key not in cache:
            rid = eng.add_request(list(prompt), params)
            out = drain(eng)[rid]
            cache[key] = out.outputs[0].token_ids
        return cache[key]
    return ref


def drain(*engines, until=None):
    """Step the engines until none has work (or until() holds); finished outputs by id."""
    done = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < WAIT_S:
        busy = False
        for e in engines:
            if e.has_unfinished_requests():
                busy = True
                for o in e.step():
                    if o.finished:
                        done[o.request_id] = o
        if until is not None and until():
            return done
        if not busy:
            return done
    raise AssertionError("engines still busy after the time bound: a transfer hangs")


def run_decode(P, D):
    """Step both until the decode engine is done (the prefill one may still hold other hand-overs)."""
    return drain(P, D, until=lambda: not D.has_unfinished_requests())


def assert_baseline(*engines):
    for e in engines:
        assert e.kv.pool.num_free == e.kv.num_blocks, "a KV block leaked"
        assert not e.scheduler.has_work
        if e.handover is not None:
            assert not e.handover.pinned and not e.handover.loading


@pytest.fixture
def shm_pair(tmp_path):
    store = new_store()
    mk = lambda role, rank, **kw: engine(role, dict(kind="shm", rank=rank, world_size=2, store=store,  # noqa: E731
                                                    shm_dir=str(tmp_path), timeout_s=5), **kw)
    made = []

    def make(p_kw=None, d_kw=None):
        made.extend([mk("prefill", 0, **(p_kw or {})), mk("decode", 1, **(d_kw or {}))])
        return made[-2], made[-1]
    yield make
    for e in made:
        e.shutdown()


def prefill(P, prompts, params=GREEDY, prefix="r"):
    ids = [P.add_request(list(p), params, request_id=f"{prefix}{i}") for i, p in enumerate(prompts)]
    outs = drain(P, until=lambda: not P.scheduler.has_work)
    return [outs[i] for i in ids]


def test_gather_scatter_blocks_roundtrip():
    """The flat layout against plain indexing: any block order, runs and single blocks, mixed dtypes."""
    from llmkern.kvcache.blocks import gather_blocks, kv_cache_geometry, scatter_blocks

    g = torch.Generator().manual_seed(0)
    src = [(torch.randn(12, BS, 2, 8, generator=g), torch.randn(12, BS, 2, 8, generator=g)),
           (torch.randn(12, BS, 1, 4, generator=g).half(), torch.randn(12, BS, 1, 4, generator=g).half())]
    dst = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in src]
    ids, into = [7, 8, 9, 2, 11, 0, 1], [3, 4, 10, 5, 6, 7, 8]
    data = gather_blocks(src, ids)
    assert data.dtype == torch.uint8 and data.numel() == len(ids) * kv_cache_geometry(src)[0]
    scatter_blocks(dst, into, data)
    for (sk, sv), (dk, dv) in zip(src, dst):
        for s_, d_ in ((sk, dk), (sv, dv)):
            assert torch.equal(d_[into], s_[ids])
            rest = [b for b in range(12) if b not in into]
            assert not d_[rest].any()


# -- shared memory, both engines in this process ------------------------------------------------
def test_shm_greedy_identical_and_bytes(shm_pair, reference, tmp_path):
    P, D = shm_pair()
    outs = prefill(P, PROMPTS)
    for o, p in zip(outs, PROMPTS):
        assert o.outputs[0].token_ids == reference(p)[:1]  # the prefill engine stops at one token
        assert o.kv_transfer_params["num_tokens"] == len(p)
        json.dumps(o.kv_transfer_params)  # travels in an HTTP response
    assert P.stats().kv_blocks_pinned == sum(kv_blocks(len(p)) for p in PROMPTS)
    for o, p in zip(outs, PROMPTS):
        D.add_request(list(p), GREEDY, request_id=o.request_id, kv_transfer_params=o.kv_transfer_params)
    done = run_decode(P, D)
    for o, p in zip(outs, PROMPTS):
        d = done[o.request_id]
        assert d.error is None and d.outputs[0].token_ids == reference(p)
        assert d.metrics.kv_transfer_bytes == kv_blocks(len(p)) * BLOCK_BYTES
    total = sum(kv_blocks(len(p)) for p in PROMPTS) * BLOCK_BYTES
    assert P.stats().kv_bytes_sent == total and D.stats().kv_bytes_received == total
    assert D.stats().prompt_tokens_computed == 0  # nothing was prefilled on the decode side
    assert_baseline(P, D)
    assert os.listdir(tmp_path) == []


def test_shm_prefix_cached_decode_receives_only_the_rest(shm_pair, reference):
    P, D = shm_pair()
    shared = list(range(10, 22))  # 3 full blocks
    D.add_request(shared + [40, 41], GREEDY, request_id="warm")  # run co-located on D: caches the prefix
    drain(D)
    prompt = shared + [50, 51, 52, 53, 54]
    (o,) = prefill(P, [prompt])
    D.add_request(prompt, GREEDY, request_id="x", kv_transfer_params=o.kv_transfer_params)
    d = run_decode(P, D)["x"]
    assert d.outputs[0].token_ids == reference(prompt)
    assert d.metrics.kv_transfer_bytes == (kv_blocks(len(prompt)) - 3) * BLOCK_BYTES
    assert_baseline(P, D)


def test_shm_logprobs_and_stop_on_first_token(shm_pair):
    P, D = shm_pair()
    C = engine()
    lp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    C.add_request(PROMPTS[1], lp, request_id="c")
    want = drain(C)["c"].outputs[0]
    (o,) = prefill(P, PROMPTS[1:2], lp)
    D.add_request(PROMPTS[1], lp, request_id="d", kv_transfer_params=o.kv_transfer_params)
    got = run_decode(P, D)["d"].outputs[0]
    assert got.token_ids == want.token_ids and len(got.logprobs) == len(want.logprobs) == 4
    for (a, top_a), (b, top_b) in zip(got.logprobs, want.logprobs):  # the first one is the prefill side's
        assert a == pytest.approx(b, abs=1e-4) and [t for t, _ in top_a] == [t for t, _ in top_b]
    # the first token already ends the request (a stop token): the decode side only reports it
    first = want.token_ids[0]
    (o,) = prefill(P, PROMPTS[1:2], SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[first]), "s")
    D.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[first]), request_id="s",
                  kv_transfer_params=o.kv_transfer_params)
    d = run_decode(P, D)["s"]
    assert d.outputs[0].token_ids == [first] and d.finish_reason == "stop"
    assert_baseline(P, D)


def test_shm_deadline_frees_both_sides(shm_pair):
    P, D = shm_pair(p_kw=dict(kv_transfer_timeout_s=0.5), d_kw=dict(kv_transfer_timeout_s=0.5))
    (o,) = prefill(P, PROMPTS[2:3])
    D.add_request(PROMPTS[2], GREEDY, request_id="late", kv_transfer_params=o.kv_transfer_params)
    d = drain(D)["late"]  # the prefill engine is never stepped: its side never answers
    assert d.finish_reason == "error" and "deadline" in d.error and "kv_transfer_timeout_s" in d.error
    assert P.stats().kv_blocks_pinned == kv_blocks(len(PROMPTS[2]))
    time.sleep(0.6)
    drain(P)  # past its deadline the prefill side releases the blocks by itself
    assert P.stats().kv_blocks_pinned == 0
    assert_baseline(P, D)


def test_shm_abort_during_transfer_then_next_request(shm_pair, reference, tmp_path):
    P, D = shm_pair()
    outs = prefill(P, PROMPTS[:2])
    D.add_request(PROMPTS[0], GREEDY, request_id="r0", kv_transfer_params=outs[0].kv_transfer_params)
    D.step()                       # allocates, posts the pull
    assert D.stats().num_waiting_for_kv == 1
    assert D.abort("r0")           # blocks freed now; what arrives later is dropped
    assert D.kv.pool.num_free == D.kv.num_blocks
    P.step()                       # the prefill side answers the pull anyway
    d = run_decode(P, D)
    assert d["r0"].finish_reason == "abort"
    # the pair still works, and the aborted payload went nowhere
    D.add_request(PROMPTS[1], GREEDY, request_id="r1", kv_transfer_params=outs[1].kv_transfer_params)
    assert run_decode(P, D)["r1"].outputs[0].token_ids == reference(PROMPTS[1])
    assert_baseline(P, D)
    assert os.listdir(tmp_path) == []


def test_shm_prefill_side_abort_and_recompute_fallback(shm_pair, reference):
    P, D = shm_pair(d_kw=dict(kv_transfer_fallback="recompute"))
    (o,) = prefill(P, PROMPTS[1:2])
    assert P.abort(o.request_id)   # a pinned hand-over can be dropped by id
    assert P.stats().kv_blocks_pinned == 0
    D.add_request(PROMPTS[1], GREEDY, request_id="re", kv_transfer_params=o.kv_transfer_params)
    d = run_decode(P, D)["re"]          # the pull is refused; the decode engine computes the prompt itself
    assert d.error is None and d.outputs[0].token_ids == reference(PROMPTS[1])
    assert D.stats().kv_transfers_failed == 1
    assert_baseline(P, D)


def test_shm_decode_gone_file_removed(shm_pair, tmp_path):
    P, D = shm_pair(p_kw=dict(kv_transfer_timeout_s=0.5))
    P.handover.connector.timeout_s = 0.5
    (o,) = prefill(P, PROMPTS[:1])
    D.add_request(PROMPTS[0], GREEDY, request_id="g", kv_transfer_params=o.kv_transfer_params)
    D.step()                       # the pull is posted, then the decode engine is never heard of again
    drain(P, until=lambda: P.stats().kv_blocks_pinned == 0)
    assert len(os.listdir(tmp_path)) == 1   # written for the reader that never came
    time.sleep(0.6)
    drain(P)
    assert os.listdir(tmp_path) == []
    assert_baseline(P)
    D.abort("g")


def test_shm_stale_files_of_dead_writers_removed(tmp_path):
    from llmkern.pd.shm import remove_stale_files

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"llmkern-kv-{dead.pid}-default-0-1-0").write_bytes(b"x")
    (tmp_path / f"llmkern-kv-{os.getpid()}-default-0-1-0").write_bytes(b"x")  # a live writer's
    (tmp_path / "other").write_bytes(b"x")
    assert remove_stale_files(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == sorted([f"llmkern-kv-{os.getpid()}-default-0-1-0", "other"])


def test_bad_kv_transfer_params_are_refused(shm_pair):
    P, D = shm_pair()
    (o,) = prefill(P, PROMPTS[1:2])
    kp = o.kv_transfer_params
    with pytest.raises(ValueError, match="prompt_token_ids differ"):
        D.add_request(PROMPTS[0], GREEDY, kv_transfer_params=kp)
    with pytest.raises(ValueError, match="block_hashes"):
        D.add_request(PROMPTS[1], GREEDY, kv_transfer_params=dict(kp, block_hashes=[h + 1 for h in kp["block_hashes"]]))
    with pytest.raises(ValueError, match="expired"):
        D.add_request(PROMPTS[1], GREEDY, kv_transfer_params=dict(kp, expires_at=time.time() - 1))
    with pytest.raises(ValueError, match="missing"):
        D.add_request(PROMPTS[1], GREEDY, kv_transfer_params={"engine_id": "x"})
    with pytest.raises(ValueError, match="not reachable"):
        D.add_request(PROMPTS[1], GREEDY, kv_transfer_params=dict(kp, engine_id="shm:other@h:1/0"))
    with pytest.raises(ValueError, match="kv_block_bytes|bytes"):
        D.add_request(PROMPTS[1], GREEDY, kv_transfer_params=dict(kp, kv_block_bytes=kp["kv_block_bytes"] * 2))
    with pytest.raises(ValueError, match="does not take KV"):
        P.add_request(PROMPTS[1], GREEDY, kv_transfer_params=kp)
    with pytest.raises(ValueError, match="n:"):
        P.add_request(PROMPTS[1], SamplingParams(n=2, max_tokens=3))
    with pytest.raises(ValueError, match="kv_connector"):
        EngineConfig(kv_role="decode")
    assert P.abort(o.request_id)
    assert_baseline(P, D)


def test_connector_from_kind_and_options(tmp_path, reference):
    """The form a command line passes: a kind and options with a HOST:PORT rendezvous."""
    from distributed_helpers import free_port

    opts = dict(rendezvous=f"127.0.0.1:{free_port()}", world_size=2, shm_dir=str(tmp_path))
    P = Engine(MODEL, EngineConfig(kv_role="prefill", kv_connector="shm", kv_connector_options=dict(opts, rank=0),
                                   **ENGINE), load_format="dummy")
    D = Engine(MODEL, EngineConfig(kv_role="decode", kv_connector="shm", kv_connector_options=dict(opts, rank=1),
                                   **ENGINE), load_format="dummy")
    try:
        (o,) = prefill(P, PROMPTS[1:2])
        D.add_request(PROMPTS[1], GREEDY, request_id="s", kv_transfer_params=o.kv_transfer_params)
        assert run_decode(P, D)["s"].outputs[0].token_ids == reference(PROMPTS[1])
        assert_baseline(P, D)
    finally:
        D.shutdown()
        P.shutdown()


# -- torch.distributed point-to-point, two processes ---------------------------------------------
class Peer:
    """An engine in a child process (tests/pd_peer.py), driven by JSON lines; always reaped."""

    def __init__(self, role: str, rank: int, port: int, kind: str = "p2p", conn_kw=None, **engine_kw):
        spec = {"model": MODEL, "engine": dict(ENGINE, kv_role=role, **engine_kw, kv_connector=dict(
            kind=kind, rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, is_master=False,
            timeout_s=90, **(conn_kw or {})))}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        self.proc = subprocess.Popen([sys.executable, PEER, json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.lines: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        try:
            msg = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError("the peer engine did not answer in time") from None
        assert msg is not None, f"the peer engine exited (code {self.proc.poll()})"
        return msg

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.kill()


def p2p_pair(local_role: str, local_rank: int, kind: str = "p2p", conn_kw=None, **peer_kw):
    """(this process's engine, the peer in a child process); this process hosts the store."""
    store = new_store()
    peer = Peer("prefill" if local_role == "decode" else "decode", 1 - local_rank, store.port, kind, conn_kw,
                **peer_kw)
    try:
        local = engine(local_role, dict(kind=kind, rank=local_rank, world_size=2, store=store, timeout_s=90,
                                        **(conn_kw or {})))
        assert peer.read()["ready"]
    except BaseException:
        peer.close()
        raise
    return local, peer


def remote_prefill(peer: Peer, prompts, prefix="p"):
    for i, p in enumerate(prompts):
        peer.send(op="add", id=f"{prefix}{i}", prompt=list(p), params=dict(temperature=0, max_tokens=10,
                                                                          ignore_eos=True))
    outs = {}
    while len(outs) < len(prompts):
        m = peer.read()
        outs[m["finished"]] = m
    return [outs[f"{prefix}{i}"]["kv_transfer_params"] for i in range(len(prompts))]


def test_p2p_two_processes(reference):
    D, peer = p2p_pair("decode", 0)
    try:
        params = remote_prefill(peer, PROMPTS)
        for i, (kp, p) in enumerate(zip(params, PROMPTS)):
            D.add_request(list(p), GREEDY, request_id=f"d{i}", kv_transfer_params=kp)
        done = drain(D)
        for i, p in enumerate(PROMPTS):
            assert done[f"d{i}"].error is None
            assert done[f"d{i}"].outputs[0].token_ids == reference(p)
            assert done[f"d{i}"].metrics.kv_transfer_bytes == kv_blocks(len(p)) * BLOCK_BYTES
        # prefix caching on the decode side: the blocks it holds now are not received again
        prompt = PROMPTS[2][:12] + [99, 98, 97]
        (kp,) = remote_prefill(peer, [prompt], "q")
        D.add_request(prompt, GREEDY, request_id="pc", kv_transfer_params=kp)
        d = drain(D)["pc"]
        assert d.outputs[0].token_ids == reference(prompt)
        assert d.metrics.kv_transfer_bytes == (kv_blocks(len(prompt)) - 3) * BLOCK_BYTES
        # abort while the bytes are on their way; the stream stays in step for the next request
        kp0, kp1 = remote_prefill(peer, PROMPTS[:2], "a")
        D.add_request(PROMPTS[0], GREEDY, request_id="ab", kv_transfer_params=kp0)
        D.step()
        assert D.abort("ab")
        D.add_request(PROMPTS[1], GREEDY, request_id="ok", kv_transfer_params=kp1)
        done = drain(D)
        assert done["ab"].finish_reason == "abort"
        assert done["ok"].outputs[0].token_ids == reference(PROMPTS[1])
        assert_baseline(D)
        peer.send(op="stats")
        st = peer.read()["stats"]
        assert st["kv_blocks_pinned"] == 0 and st["kv_blocks_free"] == st["kv_blocks_total"]
        # the aborted pull was sent but dropped: its blocks past the prefix D had cached already
        aborted = (kv_blocks(len(PROMPTS[0])) - len(PROMPTS[0]) // BS) * BLOCK_BYTES
        assert st["kv_bytes_sent"] == D.stats().kv_bytes_received + aborted
    finally:
        peer.close()
        D.shutdown()


def test_p2p_prefill_hung_then_killed():
    D, peer = p2p_pair("decode", 0)
    try:
        params = remote_prefill(peer, PROMPTS[:4])
        # hung (stopped) prefill engine: the request fails at its deadline, blocks freed ...
        os.kill(peer.proc.pid, signal.SIGSTOP)
        D.handover.timeout_s = 1.0  # this request's wait only (the engine's kv_transfer_timeout_s)
        D.add_request(PROMPTS[0], GREEDY, request_id="h", kv_transfer_params=params[0])
        d = drain(D)["h"]
        assert d.finish_reason == "error" and "deadline" in d.error, d.error
        assert_baseline(D)
        # ... and once it runs again, the pair is still in step: the next hand-over works
        os.kill(peer.proc.pid, signal.SIGCONT)
        D.handover.timeout_s = 300.0
        D.add_request(PROMPTS[1], GREEDY, request_id="ok", kv_transfer_params=params[1])
        assert drain(D)["ok"].error is None
        # killed: the receive fails when the peer's socket closes, long before the deadline
        peer.kill()
        D.add_request(PROMPTS[2], GREEDY, request_id="k", kv_transfer_params=params[2])
        d = drain(D)["k"]
        assert d.finish_reason == "error" and "rank 1" in d.error and "deadline" not in d.error, d.error
        D.add_request(PROMPTS[3], GREEDY, request_id="k2", kv_transfer_params=params[3])
        assert "failed earlier" in drain(D)["k2"].error  # later ones fail at once
        assert_baseline(D)
    finally:
        peer.close()
        D.shutdown()


def test_p2p_decode_killed_mid_transfer():
    P, peer = p2p_pair("prefill", 0, kv_transfer_timeout_s=300)
    try:
        (o,) = prefill(P, PROMPTS[2:3])
        peer.send(op="add", id="x", prompt=PROMPTS[2], params=dict(temperature=0, max_tokens=10),
                  kv_transfer_params=o.kv_transfer_params)
        conn = P.handover.connector
        t0 = time.monotonic()
        while not conn.pulls_waiting() and time.monotonic() - t0 < WAIT_S:
            time.sleep(0.01)
        assert conn.pulls_waiting()
        peer.kill()
        # the send fails on the closed socket; the blocks come back long before the 300 s deadline
        drain(P, until=lambda: P.stats().kv_blocks_pinned == 0)
        assert P.stats().kv_transfers_failed == 1 and P.stats().kv_bytes_sent == 0
        assert_baseline(P)
    finally:
        peer.close()
        P.shutdown()


def test_shm_prefill_process_killed(tmp_path):
    """Same host: the decode side sees its prefill peer's process gone and fails at once."""
    D, peer = p2p_pair("decode", 0, kind="shm", conn_kw=dict(shm_dir=str(tmp_path)), kv_transfer_timeout_s=300)
    try:
        params = remote_prefill(peer, PROMPTS[:1])
        peer.kill()
        D.add_request(PROMPTS[0], GREEDY, request_id="k", kv_transfer_params=params[0])
        d = drain(D)["k"]  # bounded by WAIT_S, far below the 300 s deadline
        assert d.finish_reason == "error" and "exited" in d.error, d.error
        assert_baseline(D)
    finally:
        peer.close()
        D.shutdown()


def test_streamed_first_token_comes_alone_when_the_kv_arrives(shm_pair, reference):
    """A streaming decode request emits the prefill's first token as soon as its KV is in, not
    together with the second token after a decode step (that would add a step to its TTFT)."""
    P, D = shm_pair()
    p = PROMPTS[0]
    o = prefill(P, [p])[0]
    D.add_request(list(p), GREEDY, request_id="s", stream=True, kv_transfer_params=o.kv_transfer_params)
    deltas = []
    t0 = time.monotonic()
    while D.has_unfinished_requests() and time.monotonic() - t0 < WAIT_S:
        P.step()
        deltas += [out.outputs[0].delta_token_ids for out in D.step() if out.outputs[0].delta_token_ids]
    assert deltas[0] == reference(p)[:1]
    assert sum(deltas, []) == reference(p)
    assert_baseline(D)
