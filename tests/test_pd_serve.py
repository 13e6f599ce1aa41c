"""Prefill-decode disaggregated serving on loopback, through the real `openai` client and httpx:
`llmkern serve --pd 1P1D` gives the same greedy outputs as a co-located `llmkern serve` (chat and
completions, streamed and not), moves exactly the KV bytes the prompt's blocks hold (only the
blocks the decode replica does not already cache), and survives a replica killed mid-run: a dead
prefill replica's requests are served co-located by the decode replica, a dead decode replica's
streams end with an error event, nothing hangs and no block stays pinned. Every process is reaped
by its context manager, also on failure."""
from __future__ import annotations

import asyncio
import glob
import json
import math
import os
import signal

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from serve_helpers import ServerProcess, free_port, post_completion, tiny_model_dir, wait_until  # noqa: E402

ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-cache-memory-gb", "0.02", "--max-num-seqs", "16",
               "--max-num-batched-tokens", "512", "--block-size", "16"]
PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 2, "Tell me a story about a robot",
           "0123456789 " * 7]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def servers(model_dir):
    """A co-located server and `serve --pd 1P1D`, started at once (start-up dominates)."""
    procs = []
    try:
        co = ServerProcess(["--model", model_dir, *ENGINE_ARGS], wait=False)
        procs.append(co)
        pd = ServerProcess(["--model", model_dir, "--pd", "1P1D", *ENGINE_ARGS], wait=False)
        procs.append(pd)
        for p in procs:
            p.wait_ready()
        _wait(lambda: len([w for w in _workers(pd) if w["healthy"]]) == 2, what="both replicas healthy")
        yield co, pd
    finally:
        for p in procs:
            p.__exit__(None, None, None)


def _workers(router):
    return httpx.get(router.base + "/admin/workers", timeout=10).json()["workers"]


def _replica(router, role):
    (w,) = [w for w in _workers(router) if w["role"] == role]
    return w["url"]


def _wait(cond, timeout=30.0, what="condition"):
    return wait_until(cond, timeout, what)


def _metric(url, name, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _chat(c, **kw):
    return c.chat.completions.create(model="tiny", temperature=0, **kw)


def test_greedy_outputs_equal_colocated(servers):
    co, pd = servers
    cc, pc = co.client(), pd.client()
    for p in PROMPTS:
        for mt in (1, 17):
            ref = cc.completions.create(model="tiny", prompt=p, max_tokens=mt, temperature=0)
            got = pc.completions.create(model="tiny", prompt=p, max_tokens=mt, temperature=0)
            assert got.choices[0].text == ref.choices[0].text
            assert got.choices[0].finish_reason == ref.choices[0].finish_reason
            assert got.usage.model_dump() == ref.usage.model_dump()
            parts = [ch.choices[0].text for ch in pc.completions.create(model="tiny", prompt=p, max_tokens=mt,
                                                                         temperature=0, stream=True) if ch.choices]
            assert "".join(parts) == ref.choices[0].text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    ref = _chat(cc, messages=msgs, max_tokens=12, logprobs=True, top_logprobs=2)
    got = _chat(pc, messages=msgs, max_tokens=12, logprobs=True, top_logprobs=2)
    assert got.choices[0].message.content == ref.choices[0].message.content
    for a, b in zip(got.choices[0].logprobs.content, ref.choices[0].logprobs.content, strict=True):
        assert a.token == b.token and math.isclose(a.logprob, b.logprob, rel_tol=1e-4, abs_tol=1e-4)
    chunks = list(_chat(pc, messages=msgs, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        ref.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        [ref.choices[0].finish_reason]
    # Not covered by the hand-over (n > 1): served whole by the decode replica, still equal.
    ref = cc.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0, n=2)
    got = pc.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0, n=2)
    assert [c.text for c in got.choices] == [c.text for c in ref.choices]
    # The router's counters say which path each request took.
    m = pd.metrics()
    assert m[("llmkern_router_pd_requests_total", ())] == len(PROMPTS) * 2 * 2 + 2
    assert m[("llmkern_router_pd_direct_total", ())] == 1
    assert m[("llmkern_router_pd_fallbacks_total", ())] == 0


def test_request_errors_come_through(servers):
    co, pd = servers
    bad = httpx.post(pd.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "top_p": 7}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
    long_ = httpx.post(pd.base + "/v1/completions", json={"model": "tiny", "prompt": "y" * 600}, timeout=30)
    assert long_.status_code == 413 and long_.json()["error"]["code"] == "context_length_exceeded"
    # Each role refuses what it cannot do, naming the field.
    r = httpx.post(co.base + "/v1/completions", json={"model": "tiny", "prompt": "x",
                                                      "kv_transfer_params": {"engine_id": "e"}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
    r = httpx.post(_replica(pd, "prefill") + "/v1/completions",
                   json={"model": "tiny", "prompt": "x", "stream": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    for params in ({"engine_id": "e"}, "garbage", {"do_remote_decode": True}):
        r = httpx.post(_replica(pd, "decode") + "/v1/completions",
                       json={"model": "tiny", "prompt": "x", "kv_transfer_params": params}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


def _block_bytes(model_dir, block_size=16) -> int:
    """K and V of one block over all layers, fp32: from the model's config, not from the engine."""
    with open(f"{model_dir}/config.json") as f:
        c = json.load(f)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * block_size * c["num_key_value_heads"] * head_dim * 4


def test_kv_bytes_moved_equal_the_prompts_blocks(servers, model_dir):
    _, pd = servers
    dec, pre = _replica(pd, "decode"), _replica(pd, "prefill")
    name = "llmkern:kv_transfer_bytes_total"
    bb = _block_bytes(model_dir)
    c = pd.client()
    base = "Zebras quietly graze near the river at dawn; " * 2      # 92 characters: 5 full blocks + 12
    before = _metric(dec, name, direction="received"), _metric(pre, name, direction="sent")
    r = c.completions.create(model="tiny", prompt=base, max_tokens=3, temperature=0)
    n1 = r.usage.prompt_tokens
    moved = _metric(dec, name, direction="received") - before[0]
    assert moved == math.ceil(n1 / 16) * bb
    assert _metric(pre, name, direction="sent") - before[1] == moved
    # The decode replica now caches the prompt's full blocks: a longer prompt on the same prefix
    # receives only the blocks past them.
    before = _metric(dec, name, direction="received")
    r = c.completions.create(model="tiny", prompt=base + "and then they run off into the hills.", max_tokens=3,
                             temperature=0)
    moved = _metric(dec, name, direction="received") - before
    assert moved == (math.ceil(r.usage.prompt_tokens / 16) - n1 // 16) * bb
    _wait(lambda: _metric(pre, "llmkern:kv_blocks_pinned") == 0, 10, "the prefill side to unpin")


# -- failures --------------------------------------------------------------------------------------------
def _replica_pid(launcher, role) -> int:
    """The pid of the launcher's `serve --role ROLE` child (Linux /proc)."""
    pid = launcher.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(x) for x in f.read().split()]
    for k in kids:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        if b"--role" in args and args[args.index(b"--role") + 1] == role.encode():
            return k
    raise AssertionError(f"no {role} replica among {kids}")


async def _one(client, base, i, stream, max_tokens=120):
    res = await post_completion(client, base, {"model": "tiny", "prompt": PROMPTS[i % 3] + f" #{i}",
                                               "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                                               "stream": stream})
    if res[0] == "done":
        return ("done", res[1]["choices"][0]["text"])
    if res[0] == "http_error":
        return res
    events = res[1]
    assert events[-1] == "[DONE]"
    errors = [json.loads(e) for e in events[:-1] if '"error"' in e]
    if errors:
        return ("stream_error", errors[0])
    return ("done", "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"]))


def test_prefill_replica_killed_mid_run(servers):
    """The last test on the 1P1D launch: it kills its prefill replica."""
    co, pd = servers
    ref = {i: co.client().completions.create(model="tiny", prompt=PROMPTS[i % 3] + f" #{i}", max_tokens=120,
                                             temperature=0, extra_body={"ignore_eos": True}).choices[0].text
           for i in range(10)}
    victim = _replica_pid(pd, "prefill")
    decode = _replica(pd, "decode")

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = []
            for i in range(10):
                tasks.append(asyncio.ensure_future(_one(client, pd.base, i, stream=i % 2 == 0)))
                await asyncio.sleep(0.05)
                if i == 3:
                    os.kill(victim, signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*tasks), 90)

    results = asyncio.run(scenario())
    # None lost: every request is answered whole (those not yet prefilled by the decode replica,
    # co-located), exactly as a co-located server answers it.
    for i, res in enumerate(results):
        assert res == ("done", ref[i]), (i, res)
    m = pd.metrics()
    assert m[("llmkern_router_pd_fallbacks_total", ())] >= 1
    r = pd.client().completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0)
    assert r.choices[0].text == co.client().completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5,
                                                               temperature=0).choices[0].text
    _wait(lambda: _metric(decode, "llmkern:kv_cache_usage_perc") == 0
          and _metric(decode, "llmkern:num_requests_waiting_for_kv") == 0, 15, "decode blocks freed")


class _Cluster:
    """A prefill and a decode replica and `llmkern router --pd`, launched one by one (the multi-machine
    way), with the shared-memory connector."""

    def __init__(self, model_dir, timeout_s=3.0, connector="shm"):
        rdv = f"127.0.0.1:{free_port()}"
        common = ["--model", model_dir, *ENGINE_ARGS, "--kv-connector", connector, "--kv-rendezvous", rdv,
                  "--kv-world-size", "2", "--kv-transfer-timeout-s", str(timeout_s)]
        self.procs = []
        try:
            self.prefill = self._add(ServerProcess([*common, "--role", "prefill", "--kv-rank", "0"], wait=False))
            self.decode = self._add(ServerProcess([*common, "--role", "decode", "--kv-rank", "1"], wait=False))
            self.prefill.wait_ready()
            self.decode.wait_ready()
            self.router = self._add(ServerProcess(["--model", model_dir, "--pd", "--prefill", self.prefill.base,
                                                   "--decode", self.decode.base], command="router"))
            _wait(lambda: all(w["healthy"] for w in _workers(self.router)), what="workers healthy")
        except BaseException:
            self.close()
            raise

    def _add(self, p):
        self.procs.append(p)
        return p

    def close(self):
        """SIGTERM first (a server drains, then releases its engine's connector: groups, files),
        SIGKILL whatever is still running after 20 s."""
        for p in self.procs:
            if p.proc.poll() is None:
                p.signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except Exception:  # noqa: BLE001 - killed below
                pass
            p.__exit__(None, None, None)


@pytest.fixture
def cluster(model_dir):
    c = _Cluster(model_dir)
    try:
        yield c
    finally:
        c.close()


def test_decode_replica_killed_mid_run(cluster):
    async def scenario():
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.ensure_future(_one(client, cluster.router.base, i, stream=i % 2 == 0, max_tokens=400))
                     for i in range(6)]
            await asyncio.get_running_loop().run_in_executor(None, lambda: _wait(
                lambda: _metric(cluster.decode.base, "llmkern:num_requests_running") >= 3, 30, "decoding"))
            cluster.decode.signal(signal.SIGKILL)
            cluster.decode.wait(10)         # reaped, as a launcher or service manager would
            return await asyncio.wait_for(asyncio.gather(*tasks), 90)

    results = asyncio.run(scenario())
    failed = 0
    for res in results:       # each finished or says why not: an error event or an error object
        if res[0] == "stream_error":
            assert res[1]["error"]["code"] == "replica_failed"
            failed += 1
        elif res[0] == "http_error":
            assert res[1] >= 500 and res[2]["error"]["message"]
            failed += 1
        else:
            assert res[0] == "done"
    assert failed >= 1
    # With no decode replica left the router answers at once with a clear error, no hang.
    r = httpx.post(cluster.router.base + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4},
                   timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] in ("decode_unavailable", "no_workers",
                                                                   "all_workers_failed")
    # Every failure the clients saw is counted: after streaming began (per replica), or before (a
    # prefilled request no decode replica continued). Which one a request hits depends on whether
    # its first chunk had reached the router when the replica died.
    m = cluster.router.metrics()
    counted = sum(v for (n, _), v in m.items()
                  if n in ("llmkern_router_failures_total", "llmkern_router_pd_decode_errors_total"))
    assert counted >= failed
    # The prefill replica gives back the blocks it held for hand-overs nobody took (deadline 3 s).
    _wait(lambda: _metric(cluster.prefill.base, "llmkern:kv_blocks_pinned") == 0, 20, "prefill blocks unpinned")
    assert _metric(cluster.prefill.base, "llmkern:kv_cache_usage_perc") == 0
    # Nothing the shared-memory connector wrote is left behind once the prefill server has exited.
    pid = cluster.prefill.proc.pid
    cluster.close()
    assert cluster.prefill.proc.returncode == 0
    from llmkern.pd.shm import default_shm_dir

    assert not glob.glob(os.path.join(default_shm_dir(), f"llmkern-kv-{pid}-*"))


def test_cli_errors():
    from llmkern.cli import main

    with pytest.raises(SystemExit, match="--pd: expected NPMD"):
        main(["serve", "--pd", "1X"])
    with pytest.raises(SystemExit, match="--role: decided by --pd"):
        main(["serve", "--pd", "1P1D", "--role", "decode"])
    with pytest.raises(SystemExit, match="--kv-connector: only for"):
        main(["serve", "--kv-connector", "shm"])
    with pytest.raises(SystemExit, match="--kv-rendezvous"):
        main(["serve", "--role", "decode", "--load-format", "dummy"])
    with pytest.raises(SystemExit, match="--prefill/--decode: only with --pd"):
        main(["router", "--prefill", "http://127.0.0.1:1"])
    with pytest.raises(SystemExit, match="decode: --pd needs at least one decode"):
        main(["router", "--pd", "--prefill", "http://127.0.0.1:1"])
