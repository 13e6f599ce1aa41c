"""KV events in vLLM's wire format (`llmkern serve --kv-events-config`). The subscriber here is
written from vLLM's published schema (vllm/distributed/kv_events.py: ZmqEventPublisher's frames,
KVEventBatch = [ts, events, data_parallel_rank], BlockStored / BlockRemoved / AllBlocksCleared
tagged by "type" in a map, or by position after the tag in the older array form) with plain
msgpack, not with llmkern's encoder; it must rebuild the replica's block set exactly, through
evictions, and from the replay socket."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
httpx = pytest.importorskip("httpx")
pytest.importorskip("tokenizers")

from serve_helpers import ServerProcess, free_port, package_root, tiny_model_dir  # noqa: E402

U64 = (1 << 64) - 1
BS = 4
# vLLM's positional order after the tag (the array form), per event type
FIELDS = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                          "lora_name"],
          "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}


def as_map(ev) -> dict:
    if isinstance(ev, dict):
        return ev
    return {"type": ev[0], **dict(zip(FIELDS[ev[0]], ev[1:]))}


class BlockSet:
    """A consumer's view of one replica: the cached hashes, with the stored blocks' tokens."""

    def __init__(self):
        self.blocks = {}            # hash -> (parent hash, tokens)
        self.removed = 0
        self.seqs = []

    def apply(self, seq: int, payload: bytes) -> None:
        ts, events, rank = msgpack.unpackb(payload, raw=False)
        assert isinstance(ts, float) and rank == 0
        self.seqs.append(seq)
        for ev in map(as_map, events):
            if ev["type"] == "BlockStored":
                hashes, toks, bs = ev["block_hashes"], ev["token_ids"], ev["block_size"]
                assert bs == BS and len(toks) == bs * len(hashes) and ev["medium"] == "GPU"
                parent = ev["parent_block_hash"]
                for i, h in enumerate(hashes):
                    self.blocks[h] = (parent, tuple(toks[i * bs:(i + 1) * bs]))
                    parent = h
            elif ev["type"] == "BlockRemoved":
                for h in ev["block_hashes"]:
                    self.removed += 1
                    self.blocks.pop(h, None)
            else:
                assert ev["type"] == "AllBlocksCleared"
                self.blocks.clear()


def recv_all(sock, view: BlockSet, topic: bytes = b"kv", idle_s: float = 0.3) -> list:
    """Apply every (topic, seq, payload) message until idle_s passes without one."""
    got = []
    while sock.poll(int(idle_s * 1000)):
        t, seq, payload = sock.recv_multipart()
        assert t == topic
        view.apply(int.from_bytes(seq, "big"), payload)
        got.append((int.from_bytes(seq, "big"), payload))
    return got


def replay(endpoint: str, start: int) -> list:
    """vLLM's replay protocol: send the start number (8 bytes, big-endian) to the ROUTER socket,
    read (seq, payload) frames until seq -1."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)   # many replies to one request: a DEALER, framed as a REQ would be
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart((b"", start.to_bytes(8, "big")))
        out = []
        while True:
            assert s.poll(5000), "no replay answer"
            empty, seq, payload = s.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                return out
            out.append((seq, payload))
    finally:
        s.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


def snapshot(srv) -> set:
    return {h & U64 for h in httpx.get(srv.base + "/kv/snapshot", timeout=10).json()["hashes"]}


def wait_subscribed(sub, mon, timeout: float = 10.0) -> None:
    """Until `sub` has connected to the publisher (`mon`: its monitor, made before it connected),
    and a moment for its subscription to reach it: a PUB socket drops what it sends before then
    (ZMQ's slow joiner), so a loaded machine could lose the first prompt's events."""
    from zmq.utils.monitor import recv_monitor_message

    try:
        if mon.poll(int(timeout * 1000)):
            recv_monitor_message(mon)
    finally:
        sub.disable_monitor()
        mon.close(0)
    time.sleep(0.3)


def complete(srv, prompt: str) -> None:
    r = httpx.post(srv.base + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text


def test_subscriber_rebuilds_the_block_set_through_evictions_and_replay(tiny_dir, tmp_path):
    # An ipc:// endpoint, which the replica binds (vLLM's rule) and nothing outside this machine
    # reaches; the replay socket on loopback TCP.
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp_path}/kv.sock",
           "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", "topic": "kv", "buffer_steps": 1000}
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    mon = sub.get_monitor_socket(zmq.EVENT_CONNECTED)
    sub.connect(cfg["endpoint"])       # before the replica binds it: ZMQ connects when it appears
    try:
        with ServerProcess(["--model", tiny_dir, "--block-size", str(BS), "--num-gpu-blocks-override", "24",
                            "--max-num-seqs", "2", "--kv-events-config", json.dumps(cfg)]) as srv:
            wait_subscribed(sub, mon)
            view, live = BlockSet(), []
            texts = [f"tenant {i}: " + "the quick brown fox jumps over the lazy dog"[i:i + 30] for i in range(8)]
            for i, t in enumerate(texts):
                complete(srv, t)
                if i % 2:
                    complete(srv, t + " again")      # a prefix hit: nothing new stored for the prefix
                end = time.monotonic() + 10
                live += recv_all(sub, view)
                while set(view.blocks) != snapshot(srv) and time.monotonic() < end:
                    live += recv_all(sub, view)
                assert set(view.blocks) == snapshot(srv), f"after prompt {i}"
            assert view.removed > 0                      # the tiny pool evicted, and said so
            assert view.seqs == list(range(len(view.seqs)))   # batches numbered from 0, none missed
            # replay from a number: the same payloads the live subscriber got from there on
            k = len(live) // 2
            again = replay(cfg["replay_endpoint"], live[k][0])
            assert again == live[k:]
            # replay from 0 rebuilds the same set, and every stored parent was stored before its child
            fresh = BlockSet()
            stored_before = set()
            for seq, payload in replay(cfg["replay_endpoint"], 0):
                batch = msgpack.unpackb(payload, raw=False)
                for ev in map(as_map, batch[1]):
                    if ev["type"] == "BlockStored":
                        assert ev["parent_block_hash"] is None or ev["parent_block_hash"] in stored_before
                        stored_before.update(ev["block_hashes"])
                fresh.apply(seq, payload)
            assert set(fresh.blocks) == snapshot(srv)
            assert srv.proc.poll() is None
    finally:
        sub.close()


def test_cleared_resync_and_array_form(tiny_dir):
    """In process: a prefix-cache reset publishes AllBlocksCleared; an overflowing queue is
    dropped and followed by a resync; the array form decodes by vLLM's positions."""
    from llmkern import LLM, SamplingParams
    from llmkern.serve.kv_events import KVEventPublisher
    from llmkern.serve.kv_events_config import KVEventsConfig
    from llmkern.router.kv_index import ReplicaKV
    from llmkern.router.kv_zmq import ZmqKVFollower
    from llmkern.serve.kv_events_zmq import ZmqKVEventSink

    llm = LLM(tiny_dir, block_size=BS, num_gpu_blocks=64, max_num_seqs=2, max_num_batched_tokens=128)
    pub = KVEventPublisher(BS).attach(llm.engine)
    ep = f"inproc://kv-events-{free_port()}"
    sink = ZmqKVEventSink(KVEventsConfig(enable_kv_cache_events=True, endpoint=ep, topic="kv",
                                         event_format="array", max_queue_size=3), BS)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(ep)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    time.sleep(0.2)                  # the subscription reaches the publisher
    pub.connect_sink(sink)
    view = BlockSet()
    follower = ZmqKVFollower(ReplicaKV(), ep)     # the router's copy, fed the same batches
    follower.reset()
    try:
        def run(text):
            llm.generate([text], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)

        def check():
            for seq, payload in recv_all(sub, view):
                follower.apply(seq, payload)
            cached = set(llm.engine.kv.pool.cached)
            assert set(view.blocks) == {h & U64 for h in cached}
            assert follower.kv.hashes == cached       # re-hashed from tokens: the engine's own hashes

        run("a prompt long enough for several blocks of four")
        check()
        assert sink.dropped > 0      # more than 3 events at once: the queue overflowed and resynced
        llm.reset_prefix_cache()
        check()
        assert view.blocks == {} and not llm.engine.kv.pool.cached
        run("another prompt, after the reset")
        check()
        assert view.blocks
    finally:
        sink.close()
        sub.close(linger=0)


def test_router_follows_a_replica_over_zmq(tiny_dir, tmp_path):
    """`llmkern router --worker URL,zmq=EP,replay=EP`: the router's copy of the replica's cache
    comes from the ZMQ stream (its /admin/workers says so) and matches the replica's."""
    cfg = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/kv.sock",
           "replay_endpoint": f"tcp://127.0.0.1:{free_port()}"}
    with ServerProcess(["--model", tiny_dir, "--block-size", str(BS), "--num-gpu-blocks-override", "24",
                        "--kv-events-config", json.dumps(cfg)]) as rep:
        complete(rep, "sent before the router starts: found by its replay")
        spec = f"{rep.base},zmq={cfg['endpoint']},replay={cfg['replay_endpoint']}"
        with ServerProcess(["--model", tiny_dir, "--worker", spec], command="router") as router:
            for i in range(4):
                complete(router, f"tenant {i} says something long enough")
            end = time.monotonic() + 10
            while True:
                (w,) = httpx.get(router.base + "/admin/workers", timeout=10).json()["workers"]
                if w["cached_blocks"] == len(snapshot(rep)) or time.monotonic() > end:
                    break
                time.sleep(0.2)
            assert w["kv_events"] == "zmq" and w["synced"] and w["cached_blocks"] == len(snapshot(rep)) > 0


@pytest.mark.parametrize("text, field", [('{"enable_kv_cache_events": true, "hwm": 0}', "hwm"),
                                         ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events"),
                                         ('{"publisher": "kafka"}', "publisher"),
                                         ('{"endpoint": "5557"}', "endpoint"),
                                         ('{"topics": "kv"}', "topics"),
                                         ('[1]', "JSON object")])
def test_bad_config_names_the_field(text, field):
    from llmkern.serve.kv_events_config import parse_kv_events_config

    with pytest.raises(ValueError, match=field):
        parse_kv_events_config(text)


def test_bad_worker_spec():
    from llmkern.router.kv_zmq import parse_worker_spec

    assert parse_worker_spec("http://h:1") == ("http://h:1", None)
    assert parse_worker_spec("http://h:1,zmq=tcp://h:5557,topic=kv")[1]["topic"] == "kv"
    for bad in ("http://h:1,replay=tcp://h:5558", "http://h:1,zmq", "http://h:1,port=5"):
        with pytest.raises(ValueError, match="worker"):
            parse_worker_spec(bad)


@pytest.mark.parametrize("args, needle", [(["--kv-events-config", '{"buffer_steps": -1}'], "buffer_steps"),
                                          (["--data-parallel-size", "2", "--kv-events-config",
                                            '{"enable_kv_cache_events": true}'], "--data-parallel-size")])
def test_bad_config_on_the_command_line(args, needle):
    import os

    env = dict(os.environ, PYTHONPATH=package_root())
    p = subprocess.run([sys.executable, "-m", "llmkern.cli", "serve", *args],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and needle in p.stderr, p.stderr[-2000:]
