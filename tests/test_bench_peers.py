"""The peer drivers of `llmkern bench e2e` (vLLM CPU, CTranslate2, llama.cpp) and their protocol, with stand-in
peer modules instead of the real ones (those live in their own venvs, absent in CI): the driver
maps the job onto the peer's API (token-id prompts, greedy, forced lengths), replies survive a
peer that prints on stdout, failures and hangs become PeerError with the process group reaped,
and an unconfigured peer is skipped with its reason."""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

pytest.importorskip("numpy", reason="the runtime needs numpy (the GPU check machine has only torch)")
pytest.importorskip("tokenizers", reason="the runtime needs tokenizers (the GPU check machine has only torch)")
from llmkern.bench.peer_e2e import run_peers  # noqa: E402
from llmkern.bench.peers.agreement import token_agreement  # noqa: E402
from llmkern.bench.peers.client import PeerError, PeerProcess, find_python  # noqa: E402

# The stand-ins' "greedy output": token k of a request is (sum(prompt) + k) % 1000 for vLLM, and
# (first prompt id + k) for CTranslate2, computed here independently of the drivers.
FAKE_VLLM = '''
import os, sys
__version__ = "0.0-fake"
print("vllm banner on stdout")
os.write(1, b"C-level noise on fd 1\\n")

class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)

class LLM:
    def __init__(self, model, dtype, skip_tokenizer_init, seed, max_model_len, **kw):
        if os.environ.get("FAKE_FAIL_INIT"):
            raise RuntimeError("fake vllm cannot load " + model)
        assert skip_tokenizer_init and dtype in ("float32", "bfloat16"), (skip_tokenizer_init, dtype)
        self.kw = kw
        self.emptied = False

    def reset_prefix_cache(self):
        self.emptied = True

    def generate(self, prompts, sps, use_tqdm=True):
        import time
        if os.environ.get("FAKE_REQUIRE_FRESH") and not self.emptied:
            raise RuntimeError("generate on a prefix cache that was not emptied")
        self.emptied = False
        time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
        print("generating", file=sys.stdout)
        outs = []
        for p, sp in zip(prompts, sps):
            assert sp.temperature == 0 and sp.ignore_eos and sp.min_tokens == sp.max_tokens, vars(sp)
            ids = p["prompt_token_ids"]
            n = sp.max_tokens + int(os.environ.get("FAKE_EXTRA", "0"))
            c = type("C", (), {"token_ids": [(sum(ids) + k) % 1000 for k in range(n)]})
            outs.append(type("O", (), {"outputs": [c]}))
        return outs
'''

FAKE_CT2 = '''
import json, os
__version__ = "0.0-fake"
print("ct2 banner on stdout")
calls = []

def get_supported_compute_types(device):
    return {"float32", "int8"}

class _Async:
    def __init__(self, ids):
        self.ids = ids
    def result(self):
        return type("R", (), {"sequences_ids": [self.ids]})

class Generator:
    def __init__(self, path, device, compute_type, inter_threads, intra_threads):
        assert os.path.exists(os.path.join(path, "model.bin"))
        with open(os.path.join(path, "vocabulary.json")) as f:
            self.inv = {t: i for i, t in enumerate(json.load(f))}

    def generate_batch(self, tokens, max_length, min_length, sampling_topk, beam_size,
                       include_prompt_in_result, asynchronous):
        assert min_length == max_length and sampling_topk == 1 and beam_size == 1
        assert not include_prompt_in_result and asynchronous
        return [_Async([self.inv[t[0]] + k for k in range(max_length)]) for t in tokens]
'''

FAKE_CT2_CONVERTERS = '''
import json, os

class TransformersConverter:
    def __init__(self, model_dir):
        self.model_dir = model_dir

    def convert(self, out, quantization, force):
        assert quantization == "float32"
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "model.bin"), "w").close()
        with open(os.path.join(out, "vocabulary.json"), "w") as f:
            json.dump([f"tok{i}" for i in range(2000)], f)
'''

FAKE_LLAMA_CPP = '''
import ctypes

__version__ = "0.0-fake"
print("llama banner on stdout")
VOCAB = 1000


def _next(ctx):
    return (sum(ctx) * 7 + len(ctx)) % VOCAB


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads",
                                                "n_threads_batch")] + [("flash_attn_type", ctypes.c_int32),
                                                                       ("kv_unified", ctypes.c_bool)]


class _Context:  # the low-level API's context: each sequence's tokens by position
    def __init__(self):
        self.seqs, self.logits = {}, {}


class _Batch:
    def __init__(self, n):
        self.n_tokens = 0
        self.token, self.pos, self.n_seq_id, self.logits = [0] * n, [0] * n, [0] * n, [0] * n
        self.seq_id = [[0] for _ in range(n)]


def llama_init_from_model(model, params):
    assert params.n_seq_max >= 1 and params.n_ctx % params.n_seq_max == 0
    return _Context()


def llama_batch_init(n, embd, n_seq_max):
    return _Batch(n)


def llama_decode(ctx, batch):
    ctx.logits = {}
    for i in range(batch.n_tokens):
        seq = ctx.seqs.setdefault(batch.seq_id[i][0], [])
        assert batch.pos[i] == len(seq), "positions must follow each sequence"
        seq.append(batch.token[i])
        if batch.logits[i]:
            row = (ctypes.c_float * VOCAB)()
            row[_next(seq)] = 1.0
            ctx.logits[i] = row
    return 0


def llama_get_logits_ith(ctx, i):
    return ctypes.cast(ctx.logits[i], ctypes.POINTER(ctypes.c_float))


def llama_batch_free(batch):
    pass


def llama_free(ctx):
    pass


class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, n_batch, flash_attn, seed, verbose):
        self.ctx = []
        self.model = object()
        self.context_params = _Params(n_ctx, n_batch, n_batch, 1, n_threads, n_threads_batch, int(flash_attn), False)

    def n_vocab(self):
        return VOCAB

    def reset(self):
        self.ctx = []

    def eval(self, tokens):
        self.ctx += list(tokens)

    def sample(self, temp):
        assert temp == 0.0
        return _next(self.ctx)
'''

PROMPTS = [[5, 7, 9], [100, 1], [3], [42, 8, 8, 8]]
LENGTHS = [4, 9, 1, 6]


@pytest.fixture
def fake_peers(tmp_path):
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (root / "llama_cpp.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    (root / "ctranslate2" / "converters").mkdir(parents=True)
    (root / "ctranslate2" / "__init__.py").write_text(textwrap.dedent(FAKE_CT2))
    (root / "ctranslate2" / "converters" / "__init__.py").write_text(textwrap.dedent(FAKE_CT2_CONVERTERS))
    return str(root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead but not yet waited for
        return f.read().split(")")[-1].split()[0] != "Z"


def test_vllm_driver_maps_the_job(fake_peers, tmp_path):
    with PeerProcess(sys.executable, "vllm_cpu_driver.py", env={"PYTHONPATH": fake_peers}, start_timeout=60) as p:
        info = p.init(str(tmp_path), "bfloat16", 2)
        assert info["peer"] == "vllm-cpu" and info["version"] == "0.0-fake"
        seconds, ids = p.generate(PROMPTS, LENGTHS, timeout=60)
    assert seconds >= 0
    assert ids == [[(sum(pr) + k) % 1000 for k in range(n)] for pr, n in zip(PROMPTS, LENGTHS)]


def test_vllm_driver_empties_the_prefix_cache_for_fresh_runs(fake_peers, tmp_path):
    env = {"PYTHONPATH": fake_peers, "FAKE_REQUIRE_FRESH": "1"}
    with PeerProcess(sys.executable, "vllm_cpu_driver.py", env=env, start_timeout=60) as p:
        p.init(str(tmp_path), "float32", 2)
        for _ in range(2):
            p.generate(PROMPTS, LENGTHS, timeout=60, fresh=True)
        with pytest.raises(PeerError, match="not emptied"):
            p.generate(PROMPTS, LENGTHS, timeout=60)


def test_ct2_driver_converts_once_and_truncates_batches(fake_peers, tmp_path):
    ct2_dir = str(tmp_path / "ct2")
    for _ in range(2):  # the second start finds the conversion in its cache
        with PeerProcess(sys.executable, "ct2_driver.py", env={"PYTHONPATH": fake_peers}, start_timeout=60) as p:
            info = p.init(str(tmp_path), "float32", 2, ct2_dir=ct2_dir, max_batch=3, inter_threads=2)
            assert "inter_threads=2 intra_threads=1 max_batch=3" in info["config"]
            _, ids = p.generate(PROMPTS, LENGTHS, timeout=60)
        assert ids == [[pr[0] + k for k in range(n)] for pr, n in zip(PROMPTS, LENGTHS)]
    assert not os.path.exists(ct2_dir + ".partial")


def test_llamacpp_driver_feeds_back_each_token(fake_peers, tmp_path):
    def greedy(prompt, n):  # the stand-in's rule, applied to the context the driver must build
        ctx, out = list(prompt), []
        for _ in range(n):
            out.append((sum(ctx) * 7 + len(ctx)) % 1000)
            ctx.append(out[-1])
        return out

    with PeerProcess(sys.executable, "llamacpp_driver.py", env={"PYTHONPATH": fake_peers}, start_timeout=60) as p:
        info = p.init(str(tmp_path), "float32", 2, gguf=str(tmp_path / "m.gguf"))
        _, ids = p.generate(PROMPTS, LENGTHS, timeout=60)  # several: llama.cpp's batched decoding
        _, one = p.generate(PROMPTS[:1], LENGTHS[:1], timeout=60)  # one: the high-level object
    assert ids == [greedy(pr, n) for pr, n in zip(PROMPTS, LENGTHS)]
    assert one == [greedy(PROMPTS[0], LENGTHS[0])]
    assert "flash_attn=1" in info["config"]  # llama.cpp's faster setting on the CPU, by default


def test_ct2_driver_rejects_a_dtype_it_lacks(fake_peers, tmp_path):
    with PeerProcess(sys.executable, "ct2_driver.py", env={"PYTHONPATH": fake_peers}, start_timeout=60) as p:
        with pytest.raises(PeerError, match="dtype: .*not bfloat16"):
            p.init(str(tmp_path), "bfloat16", 2, ct2_dir=str(tmp_path / "ct2"))


def test_failures_become_peer_errors(fake_peers, tmp_path):
    env = {"PYTHONPATH": fake_peers}
    with PeerProcess(sys.executable, "vllm_cpu_driver.py", env=dict(env, FAKE_FAIL_INIT="1")) as p:
        with pytest.raises(PeerError, match="fake vllm cannot load"):
            p.init(str(tmp_path), "float32", 2)
    with PeerProcess(sys.executable, "vllm_cpu_driver.py", env=dict(env, FAKE_EXTRA="1")) as p:
        p.init(str(tmp_path), "float32", 2)
        with pytest.raises(PeerError, match="requested lengths"):
            p.generate(PROMPTS, LENGTHS, timeout=60)
    with PeerProcess(sys.executable, "no_such_driver.py", env=env) as p:
        with pytest.raises(PeerError, match="exited with status"):
            p.init(str(tmp_path), "float32", 2)


def test_a_hung_peer_times_out_and_is_reaped(fake_peers, tmp_path):
    p = PeerProcess(sys.executable, "vllm_cpu_driver.py", env={"PYTHONPATH": fake_peers, "FAKE_SLEEP": "60"})
    try:
        p.init(str(tmp_path), "float32", 2)
        with pytest.raises(PeerError, match="no reply within"):
            p.generate(PROMPTS, LENGTHS, timeout=1)
    finally:
        p.close()
    assert p.proc.returncode is not None and not _alive(p.proc.pid)


def test_unconfigured_peers_are_skipped_with_the_reason(monkeypatch, tmp_path):
    for var in ("LLMKERN_VLLM_PYTHON", "LLMKERN_CT2_PYTHON", "LLMKERN_LLAMACPP_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    assert find_python(None, "LLMKERN_VLLM_PYTHON") == (
        None, "LLMKERN_VLLM_PYTHON is not set (the python of the peer's own venv; see bench/README.md)")
    missing = str(tmp_path / "nope" / "python")
    assert "is not an executable file" in find_python(missing, "LLMKERN_CT2_PYTHON")[1]
    records, skipped = run_peers(quick=True, pythons={"ctranslate2": missing})
    assert records == []
    assert "LLMKERN_VLLM_PYTHON is not set" in skipped["vllm-cpu"][0]
    assert "is not an executable file" in skipped["ctranslate2"][0]


def test_token_agreement():
    ref = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 9]]
    other = [[1, 2, 0, 4], [5, 6], [0, 8, 9, 9]]
    a = token_agreement(ref, other)
    assert a["prefix"] == pytest.approx((2 + 2 + 0) / 10)
    assert a["positionwise"] == pytest.approx((3 + 2 + 3) / 10)
    assert (a["identical"], a["sequences"]) == (1, 3)
    with pytest.raises(ValueError, match="other"):
        token_agreement(ref, other[:2])


def test_vllm_env_names_its_cpu_backend_and_binds_every_core(monkeypatch):
    """vllm-cpu's LLM() does not find its backend unless VLLM_TARGET_DEVICE names it ("Device string
    must not be empty"); offline and serving runs share one environment, and the user's values win."""
    from llmkern.bench.peers import PEERS
    from llmkern.bench.peers_serving import vllm_env

    for var in ("VLLM_TARGET_DEVICE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(var, raising=False)
    spec = next(s for s in PEERS if s.name == "vllm-cpu")
    env = spec.env([0, 1])
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                   "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert vllm_env()["VLLM_TARGET_DEVICE"] == "cpu"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    assert spec.env([0, 1])["VLLM_CPU_KVCACHE_SPACE"] == "8"


def test_a_row_alternates_the_engines_on_a_settled_machine(fake_peers, tmp_path, monkeypatch):
    """peer_e2e's row: it waits for the load to settle first (when asked), then runs llmkern and
    the peer in turn, each on an emptied prefix cache, and reports medians, the runs, the
    agreement of the outputs and other work's share of the machine."""
    from llmkern.bench import peer_e2e
    from llmkern.bench.peers import PEERS

    settled = []
    monkeypatch.setattr(peer_e2e, "settle", lambda bound: settled.append(bound) or 2.5)
    times = iter([0.4, 0.5, 0.6])

    class Ours:  # stands in for the llmkern engine: the peer's rule, so the outputs agree
        fresh = []

        def run(self, dtype, prompts, outs, fresh=False):
            self.fresh.append(fresh)
            ids = [[(sum(p) + k) % 1000 for k in range(n)] for p, n in zip(prompts, outs)]
            return (next(times) if fresh else 0.0), ids

    spec = next(s for s in PEERS if s.name == "vllm-cpu")
    work = ("offline-4", "out tok/s", PROMPTS, LENGTHS, {})
    ours = Ours()
    with PeerProcess(sys.executable, "vllm_cpu_driver.py", env={"PYTHONPATH": fake_peers}, start_timeout=60) as p:
        info = p.init(str(tmp_path), "float32", 2)
        rec = peer_e2e._compare(spec, p, info, "float32", ours, work, 3, {}, settle_load=1.25)
    assert settled == [1.25]
    assert ours.fresh == [False, True, True, True]  # a warm-up, then three runs on emptied caches
    assert rec.extra["llmkern_s_runs"] == "0.40 0.50 0.60" and rec.llmkern_value == pytest.approx(sum(LENGTHS) / 0.5)
    assert len(rec.extra["peer_s_runs"].split()) == 3 and rec.extra["settle_wait_s"] == 2.5
    assert rec.extra["identical_sequences"] == "4/4"
    assert 0.0 <= rec.extra["foreign_cpu"] <= 1.0
