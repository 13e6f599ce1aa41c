"""What the commands share: one-line failures, engine checks before any model is loaded, and
building the engine with errors that name the option."""
from __future__ import annotations

import os

from ..engine.args import as_option
from ..serve.command_args import serve_engine_kwargs as engine_kwargs

SERVE_HINT = "llmkern serve needs the serve extra: pip install 'llmkern[serve]'"


def fail(msg: str) -> SystemExit:
    return SystemExit("llmkern: " + " ".join(msg.split()))  # one line, whatever the message held


def check_engine_args(a) -> None:
    """Everything about the engine that can be checked without loading the model."""
    from ..engine import EngineConfig

    try:
        EngineConfig(**engine_kwargs(a))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise fail(as_option(str(e)))
    if a.model is not None and not os.path.exists(a.model) and a.load_format != "dummy":
        raise fail(f"--model: {a.model!r} does not exist (expected a HF model directory or a .gguf file)")


def make_llm(a):
    from ..engine import LLM
    from ..models.loader import INSTALL_HINT

    try:
        return LLM(a.model, load_format=a.load_format, **engine_kwargs(a))
    except FileNotFoundError as e:
        msg = str(e)
        if a.model is None and INSTALL_HINT not in msg:
            msg += f" (install the default model with: {INSTALL_HINT})"
        raise fail(msg)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise fail(as_option(str(e)))
    except RuntimeError as e:
        if str(e).startswith("distributed:"):  # a rank failed to start or to load its shard
            raise fail(str(e))
        raise fail(f"could not load the model: {type(e).__name__}: {e}")
    except (OSError, MemoryError) as e:  # e.g. a file that vanished, out of memory
        raise fail(f"could not load the model: {type(e).__name__}: {e}")


def check_writable(path: str) -> None:
    """--output must be writable before any work is done; probed without truncating it."""
    if os.path.isdir(path):
        raise fail(f"--output: {path!r} is a directory")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise fail(f"--output: cannot write {path!r}: {e.strerror or e}")


def check_device(device: str) -> None:
    from ..engine import EngineConfig

    EngineConfig(device=device)
