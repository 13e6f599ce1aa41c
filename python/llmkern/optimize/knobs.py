"""Sweep knobs -> `llmkern serve` flags (server knobs) or client settings (client knobs)."""
from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional, Tuple

# Knobs the load generator takes, not the server.
CLIENT_KNOBS = ("request_rate", "max_concurrency", "num_requests")

# Other tools' names (llm-optimizer, vLLM, SGLang) -> llmkern serve's option dest.
ALIASES = {"tp": "tensor_parallel_size", "tp_size": "tensor_parallel_size", "pp": "pipeline_parallel_size",
           "pp_size": "pipeline_parallel_size", "dp": "data_parallel_size", "dp_size": "data_parallel_size",
           "max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
           "enable_prefix_caching": "prefix_caching", "enable_chunked_prefill": "chunked_prefill"}

# Boolean knobs whose "off" is a --no-... flag.
_NEGATED = {"prefix_caching": "--no-prefix-caching", "chunked_prefill": "--no-chunked-prefill"}

# Flags the optimiser sets itself.
_RESERVED = {"host", "port", "model", "load_format", "api_key", "served_model_name", "log_level"}


def _serve_options() -> Dict[str, Tuple[str, Any]]:
    """dest -> (long option, argparse action) of `llmkern serve`."""
    from ..serve.command_args import serve_parser

    p = serve_parser()
    out = {}
    for act in p._actions:
        longs = [o for o in act.option_strings if o.startswith("--")]
        if longs:
            out[act.dest] = (longs[0], act)
    return out


def canonical(knobs: Dict[str, Any], framework: str = "llmkern") -> Dict[str, Any]:
    """Aliases resolved and every key checked: ValueError naming an unknown or reserved knob. For
    another framework only the client knobs are checked here (frameworks.check does the rest)."""
    opts = _serve_options()
    out: Dict[str, Any] = {}
    for k, v in knobs.items():
        name = ALIASES.get(k, k)
        if name in CLIENT_KNOBS:
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"sweep key {k!r}: expected a number > 0, got {v!r}")
        elif name in _NEGATED:
            if not isinstance(v, bool):
                raise ValueError(f"sweep key {k!r}: expected on/off, got {v!r}")
        elif name in _RESERVED:
            raise ValueError(f"sweep key {k!r}: set by the optimiser itself, not sweepable")
        elif framework != "llmkern":
            pass
        elif name not in opts:
            import difflib

            close = difflib.get_close_matches(name, list(opts) + list(CLIENT_KNOBS) + list(_NEGATED), n=1)
            raise ValueError(f"sweep key {k!r}: not a `llmkern serve` option or client setting"
                             + (f" (did you mean {close[0]!r}?)" if close else ""))
        if name in out:
            raise ValueError(f"sweep key {k!r}: {name!r} is set twice")
        out[name] = v
    return out


def split(knobs: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(server knobs, client knobs)."""
    server = {k: v for k, v in knobs.items() if k not in CLIENT_KNOBS}
    client = {k: v for k, v in knobs.items() if k in CLIENT_KNOBS}
    return server, client


def serve_flags(server_knobs: Dict[str, Any]) -> List[str]:
    """The `llmkern serve` arguments for server knobs (None, or 'none' where the option has no such
    choice, leaves an option at its default; --quantization none is a choice)."""
    opts = None
    flags: List[str] = []
    for k, v in server_knobs.items():
        if k in _NEGATED:
            if v is False:
                flags.append(_NEGATED[k])
            continue
        if v is None or v is False:
            continue
        if opts is None:
            opts = _serve_options()
        opt, act = opts[k]
        if v == "none" and "none" not in (act.choices or ()):   # a choice of its own (--quantization none)
            continue
        if v is True and act.nargs == 0:
            flags.append(opt)
        else:
            flags += [opt, str(v)]
    return flags


def serve_command(model: Optional[str], server_knobs: Dict[str, Any], extra: Optional[List[str]] = None) -> str:
    """The exact `llmkern serve ...` command line for a configuration."""
    argv = ["llmkern", "serve"] + (["--model", model] if model else []) + list(extra or []) + serve_flags(server_knobs)
    return " ".join(shlex.quote(a) for a in argv)


def engine_kwargs(server_knobs: Dict[str, Any]) -> Dict[str, Any]:
    """EngineConfig keyword arguments for the in-process (offline) run of a configuration."""
    from ..engine import EngineConfig

    fields = set(EngineConfig.__dataclass_fields__)
    kw: Dict[str, Any] = {}
    for k, v in server_knobs.items():
        if k == "prefix_caching":
            kw["enable_prefix_caching"] = bool(v)
        elif k == "chunked_prefill":
            kw["enable_chunked_prefill"] = bool(v)
        elif k == "speculative":
            kw["speculative"] = None if v in (None, "none") else v
        elif k in fields:
            kw[k] = v
        else:
            raise ValueError(f"sweep key {k!r}: has no effect on an offline (in-process) run")
    return kw
