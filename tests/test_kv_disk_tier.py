"""The disk KV tier: blocks written on eviction and read back exactly (by the same engine, a fresh
one, another process), greedy outputs equal to a run without the tier, and the faults: a
truncated file, a wrong checksum, another model's file, header garbage, a full disk, concurrent
writers of one block - no bad block is ever loaded and the engine goes on; the size bound (LRU);
bad options."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import random
import threading
import time
import zlib

import pytest
import torch

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")

from llmkern.engine.block_pool import Evicted
from llmkern.engine.config import EngineConfig
from llmkern.engine.kv_cache_manager import KVCacheManager
from llmkern.engine.kv_disk import DiskLink, part_sizes
from llmkern.engine.sampling_params import SamplingParams
from llmkern.engine.sequence import Request, Sequence
from llmkern.kvcache import alloc_caches
from llmkern.kvcache.disk_format import ROOT_DIGEST, chain_digest, encode_header
from llmkern.kvcache.disk_tier import SUFFIX, DiskTier

BS = 4
FP = "ab" * 16


def make_seq(tokens, sid=[0]):
    sid[0] += 1
    return Sequence(sid[0], Request(str(sid[0]), None, list(tokens), SamplingParams()), 0, None)


def make_kv(root, n=8, max_bytes=1 << 30, fp=FP):
    kv = KVCacheManager(alloc_caches(n, BS, 2, 1, 4, torch.float32, device="cpu"), BS, True)
    kv.disk = DiskLink(DiskTier(str(root), max_bytes, fp, part_sizes(kv.caches)), kv.caches, BS, kv.live_regs)
    return kv


def fill(kv, seq):
    """Pretend the model computed seq's tokens: token-dependent KV, then index the blocks."""
    assert kv.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    for pos in range(seq.num_computed_tokens, seq.num_tokens):
        b, off = seq.block_ids[pos // BS], pos % BS
        for i, (k, v) in enumerate(kv.caches):
            k[b, off] = float(seq.token_ids[pos]) + i
            v[b, off] = -float(seq.token_ids[pos])
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_blocks(seq)


def kv_ok(kv, seq, n):
    """Whether the first n tokens' KV in seq's blocks is what fill() wrote, in every layer."""
    for pos in range(n):
        b, off = seq.block_ids[pos // BS], pos % BS
        for i, (k, v) in enumerate(kv.caches):
            if not (torch.all(k[b, off] == seq.token_ids[pos] + i) and torch.all(v[b, off] == -seq.token_ids[pos])):
                return False
    return True


PROMPT = list(range(100, 117))  # 4 full blocks and one token


def written(tmp_path):
    """A tier's files holding PROMPT's blocks: computed by one manager, evicted by another prompt."""
    kv = make_kv(tmp_path)
    s = make_seq(PROMPT)
    fill(kv, s)
    kv.free(s)
    fill(kv, make_seq(range(500, 532)))  # takes every block: PROMPT's are evicted, then written
    kv.disk.tier.flush()
    assert kv.disk.tier.stats.blocks_written == 4
    return kv


def files(tmp_path):
    return sorted(p for p in (tmp_path / FP).iterdir() if p.name.endswith(SUFFIX))


def lookup(tmp_path, tokens=PROMPT, fp=FP):
    """A fresh manager on the same directory: (the manager, its sequence for tokens, tokens found cached)."""
    kv = make_kv(tmp_path, fp=fp)
    s = make_seq(tokens)
    return kv, s, kv.acquire_prefix(s)


def test_evicted_blocks_come_back_from_disk_exactly(tmp_path):
    written(tmp_path)
    kv = make_kv(tmp_path)
    s = make_seq(PROMPT)
    assert kv.cached_prefix_tokens(s) == 16  # what load reports count: the files are seen
    n = kv.acquire_prefix(s)
    assert n == 16 and kv.stats.disk_hit_tokens == 16 and kv_ok(kv, s, 16)
    assert kv.disk.tier.stats.hit_blocks == 4
    # read-back blocks are indexed like computed ones: a second sequence hits them on the device
    s2 = make_seq(PROMPT)
    assert kv.acquire_prefix(s2) == 16 and kv.stats.disk_hit_tokens == 16


def test_staged_and_assembled_buffers_have_gather_blocks_layout(tmp_path):
    from llmkern.kvcache.blocks import gather_blocks

    kv = make_kv(tmp_path)
    for k, v in kv.caches:
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
    bids = [5, 2, 3]
    want = gather_blocks(kv.caches, bids)
    buf = kv.disk._new_buffer()
    staged, ready = kv.disk._stage(bids, buf)  # the CPU path: memoryview copies
    assert ready is None and torch.equal(staged, want)
    tier, mv = kv.disk.tier, memoryview(want.numpy())
    payloads = []  # per block, as files hold them: each part of the block in turn
    for j in range(3):
        off, chunks = 0, []
        for s in tier.parts:
            chunks.append(bytes(mv[off + j * s:off + (j + 1) * s]))
            off += 3 * s
        payloads.append(memoryview(b"".join(chunks)))
    assert torch.equal(tier.assemble(payloads), want)  # the GPU path's host buffer
    kv.disk.load([7, 6, 0], payloads)
    assert torch.equal(gather_blocks(kv.caches, [7, 6, 0]), want)


def test_a_queued_prompt_is_read_ahead(tmp_path):
    written(tmp_path)
    kv = make_kv(tmp_path)
    s = make_seq(PROMPT)
    kv.prefetch(s)
    deadline = time.monotonic() + 20
    while len(kv.disk.ahead.held) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    for p in files(tmp_path):  # admission now finds the blocks in memory
        os.unlink(p)
    assert kv.acquire_prefix(s) == 16 and kv_ok(kv, s, 16) and not kv.disk.ahead.held
    kv.disk.ahead.close()


def test_a_longer_prompt_takes_the_prefix_from_disk_and_computes_the_rest(tmp_path):
    written(tmp_path)
    kv, s, n = lookup(tmp_path, PROMPT[:9] + [7, 7, 7, 7, 7])
    assert n == 8 and kv_ok(kv, s, 8)


def make_hash(i):
    s = make_seq(PROMPT)
    KVCacheManager([], BS, True)._hash_blocks(s, 4)
    return s.block_hashes[i]


def block_file(tmp_path, i):
    """The path of PROMPT's block i."""
    return DiskTier(str(tmp_path), 1 << 30, FP, [1])._path(make_hash(i))


@pytest.mark.parametrize("damage", ["truncate", "checksum", "garbage", "tokens"])
def test_a_damaged_file_is_never_loaded_and_is_deleted(tmp_path, damage):
    kv = written(tmp_path)
    victim = block_file(tmp_path, 1)  # the second block: the first comes back, nothing after it
    data = bytearray(open(victim, "rb").read())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "checksum":
        data[-5] ^= 0xFF
    elif damage == "garbage":
        data[:40] = os.urandom(40)
    else:  # a well-formed file of the same hash for other tokens (a hash collision)
        payload = bytes(data[-kv.disk.tier.block_bytes:])
        digest = chain_digest(chain_digest(ROOT_DIGEST, PROMPT[:4]), PROMPT[4:8])
        data = encode_header(bytes.fromhex(FP), make_hash(1), digest, (9, 9, 9, 9),
                             len(payload), zlib.crc32(payload)) + payload
    open(victim, "wb").write(bytes(data))
    kv, s, n = lookup(tmp_path)
    assert n == 4 and kv_ok(kv, s, 4)
    assert kv.disk.tier.stats.bad_files == 1 and not os.path.exists(victim)


def test_another_models_blocks_are_never_loaded(tmp_path):
    written(tmp_path)
    other = "cd" * 16
    assert lookup(tmp_path, fp=other)[2] == 0  # its own directory: nothing there
    for p in files(tmp_path):  # the files moved under another fingerprint's name
        os.replace(p, tmp_path / other / p.name)
    kv, _, n = lookup(tmp_path, fp=other)
    assert n == 0 and kv.disk.tier.stats.bad_files == 1 and len(os.listdir(tmp_path / other)) == 3


def test_a_full_disk_turns_writes_off_and_the_engine_goes_on(tmp_path, monkeypatch):
    kv = make_kv(tmp_path)

    def full(path, chunks):
        open(path, "wb").close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kv.disk.tier, "_write_file", full)
    s = make_seq(PROMPT)
    fill(kv, s)
    kv.free(s)
    s = make_seq(range(500, 532))
    fill(kv, s)
    kv.disk.tier.flush()
    assert not kv.disk.tier.writable and kv.disk.tier.stats.blocks_written == 0
    assert os.listdir(tmp_path / FP) == []  # no file, no temporary left
    kv.free(s)
    fill(kv, make_seq(range(600, 632)))  # more evictions: nothing staged, nothing written
    kv.disk.tier.flush()
    assert os.listdir(tmp_path / FP) == [] and lookup(tmp_path)[2] == 0


def test_a_full_write_queue_drops_blocks_and_counts_them(tmp_path, monkeypatch):
    kv = make_kv(tmp_path, n=4)
    tier = kv.disk.tier
    tier._q = __import__("queue").Queue(maxsize=1)
    release = threading.Event()
    write_job = tier._write_job
    monkeypatch.setattr(tier, "_write_job", lambda *a: (release.wait(10), write_job(*a)))
    for r in range(4):  # each prompt evicts the previous one's 4 blocks: 3 jobs of 4 blocks
        s = make_seq(range(1000 * r, 1000 * r + 16))
        fill(kv, s)
        kv.free(s)
    assert tier.stats.write_drops >= 4  # the writer is stuck on the first job, one more waits
    release.set()
    tier.flush()
    assert tier.stats.blocks_written + tier.stats.write_drops == 12 and len(files(tmp_path)) == tier.stats.blocks_written


def test_concurrent_writers_of_one_block_never_expose_a_partial_file(tmp_path):
    tiers = [DiskTier(str(tmp_path), 1 << 30, FP, [4096] * 8) for _ in range(4)]
    toks = (1, 2, 3, 4)
    digest = chain_digest(ROOT_DIGEST, toks)
    payload = torch.arange(8 * 4096, dtype=torch.int64).to(torch.uint8)
    path = tiers[0]._path(77)
    stop = threading.Event()

    def writer(t):
        mv = memoryview(payload.numpy())
        chunks = [mv[i * 4096:(i + 1) * 4096] for i in range(8)]
        while not stop.is_set():
            t._write_block(77, digest, toks, chunks)
            if random.random() < 0.5:
                try:
                    os.unlink(path)  # so a later round writes again
                except OSError:
                    pass

    threads = [threading.Thread(target=writer, args=(t,)) for t in tiers[1:]]
    for t in threads:
        t.start()
    reader, seen = tiers[0], 0
    deadline = time.monotonic() + 20
    try:
        while (seen < 100 or reader.stats.blocks_written + sum(t.stats.blocks_written for t in tiers) < 100) \
                and time.monotonic() < deadline:
            p = reader.read(77, digest, toks)
            if p is not None:
                seen += 1
                assert bytes(p) == payload.numpy().tobytes()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reader.stats.bad_files == 0 and seen > 0
    assert sum(t.stats.write_errors for t in tiers) == 0
    assert not [n for n in os.listdir(tmp_path / FP) if n.endswith(".tmp")]


def test_the_directory_stays_under_its_size_bound_least_recently_used_first(tmp_path):
    kv = written(tmp_path)
    paths = [block_file(tmp_path, i) for i in range(4)]
    size = os.path.getsize(paths[0])
    for i, p in enumerate(paths):  # the prompt's last block is the oldest file
        os.utime(p, (1003 - i, 1003 - i))
    tier = DiskTier(str(tmp_path), int(3.5 * size), FP, part_sizes(kv.caches))
    assert not os.path.exists(paths[3]) and tier.stats.files_evicted == 1  # the scan trimmed it
    kv2 = KVCacheManager(kv.caches, BS, True)
    kv2.disk = DiskLink(tier, kv.caches, BS, kv2.live_regs)
    assert kv2.acquire_prefix(make_seq(PROMPT[:5])) == 4  # a hit: block 0's file is the newest now
    s = make_seq(range(40, 49))
    fill(kv2, s)
    kv2.disk.write([Evicted(kv2.pool.blocks[b]) for b in s.block_ids[:2]])  # two more files
    tier.flush()
    assert sum(os.path.getsize(p) for p in files(tmp_path)) <= 3.5 * size
    assert os.path.exists(paths[0]) and not os.path.exists(paths[1]) and not os.path.exists(paths[2])
    assert len(files(tmp_path)) == 3


@pytest.mark.parametrize("kwargs, field", [
    (dict(kv_disk_path="D", kv_disk_gb=-1), "kv_disk_gb"),
    (dict(kv_disk_gb=2), "kv_disk_gb"),
    (dict(kv_disk_path="F/sub"), "kv_disk_path"),
    (dict(kv_disk_path="D", enable_prefix_caching=False), "kv_disk_path"),
])
def test_bad_options_name_the_field(tmp_path, kwargs, field):
    (tmp_path / "F").write_text("a file, not a directory")
    kwargs = {k: str(tmp_path / v) if k == "kv_disk_path" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=f"^{field}:"):
        EngineConfig(device="cpu", **kwargs)


def test_the_serve_options_reach_the_config(tmp_path):
    from llmkern.serve.command_args import serve_engine_kwargs, serve_parser

    a = serve_parser().parse_args(["--kv-disk-path", str(tmp_path), "--kv-disk-gb", "0.5", "--device", "cpu"])
    c = EngineConfig(**serve_engine_kwargs(a))
    assert (c.kv_disk_path, c.kv_disk_gb) == (str(tmp_path), 0.5)


# -- with the model -------------------------------------------------------------------------------
LONG = "The history of the Roman empire is long and complicated, with many emperors. " * 9
OTHER = "Quantum computers use qubits to perform calculations in a different way. " * 9
GREEDY = dict(max_tokens=8, temperature=0.0)
SMALL = dict(device="cpu", num_gpu_blocks=14)  # LONG then OTHER: LONG's blocks are evicted


@pytest.fixture(scope="module")
def reference():
    from serve_helpers import require_default_model

    require_default_model()
    from llmkern import LLM

    with LLM(**SMALL) as llm:
        return llm.generate([LONG], SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0].token_ids


def _run(path, prompts, **kw):
    from llmkern import LLM

    with LLM(**SMALL, kv_disk_path=str(path), **kw) as llm:
        outs = [llm.generate([p], SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
        llm.engine.kv.disk.tier.flush()
        return outs, llm.engine.stats()


def test_the_same_engine_and_a_fresh_one_load_the_prefix_from_disk_with_identical_output(tmp_path, reference):
    from llmkern import LLM

    with LLM(**SMALL, kv_disk_path=str(tmp_path)) as llm:
        def gen(p):
            return llm.generate([p], SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0].token_ids

        assert gen(LONG) == reference
        gen(OTHER)  # evicts LONG's last blocks: written to disk
        llm.engine.kv.disk.tier.flush()
        st = llm.engine.stats()
        assert st.kv_disk_blocks_written > 0 and st.kv_disk_hit_tokens == 0
        assert gen(LONG) == reference  # its first blocks still on the device, the others from disk
        assert llm.engine.stats().kv_disk_hit_tokens > 0
    outs, st = _run(tmp_path, [LONG], num_cpu_offload_blocks=4)  # a restart
    assert outs[0] == reference
    assert st.kv_disk_hit_tokens >= 64 and st.prompt_tokens_computed < 20 and st.kv_disk_bad_files == 0


def test_corrupted_files_are_recomputed_with_identical_output(tmp_path, reference):
    _run(tmp_path, [LONG, OTHER])
    for root, _, names in os.walk(tmp_path):
        for n in names:
            p = os.path.join(root, n)
            data = bytearray(open(p, "rb").read())
            data[-1] ^= 0xFF
            open(p, "wb").write(bytes(data))
    outs, st = _run(tmp_path, [LONG])
    assert outs[0] == reference and st.kv_disk_hit_tokens == 0 and st.kv_disk_bad_files >= 1


def test_another_process_reuses_the_blocks(tmp_path, reference):
    code = ("import sys; from llmkern import LLM, SamplingParams\n"
            f"with LLM(**{SMALL!r}, kv_disk_path=sys.argv[1]) as llm:\n"
            f"    llm.generate([{LONG!r}], SamplingParams(**{GREEDY!r}), use_tqdm=False)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-2000:]
    outs, st = _run(tmp_path, [LONG])  # the other process shut down: its cached blocks were written
    assert outs[0] == reference and st.kv_disk_hit_tokens >= 64


def test_the_docs_example_runs(tmp_path, monkeypatch, capsys):
    import re

    from serve_helpers import require_default_model

    require_default_model()
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "runtime.md")) as f:
        section = f.read().split("## The disk KV tier", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)  # its DIR is relative
    scope: dict = {}
    exec(compile(code, "docs/runtime.md", "exec"), scope)
    hits = int(capsys.readouterr().out.split()[0])
    assert hits > 0 and scope["again"][0].outputs[0].token_ids == scope["first"][0].outputs[0].token_ids
