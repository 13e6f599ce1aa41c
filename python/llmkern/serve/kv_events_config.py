"""KVEventsConfig: `--kv-events-config JSON`, spelled as vLLM spells it, so that a deployment written
for vLLM replicas (llm-d, production-stack) passes the same string to llmkern. Events are published
when enable_kv_cache_events is true and the publisher is "zmq" (the default then, as in vLLM).

One field is llmkern's own: event_format, "map" (default: what vLLM publishes since its KV events
became tagged maps, PR 42892) or "array" (the positional events of earlier vLLM releases, for
consumers not updated yet)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from typing import Optional


@dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None        # "null" | "zmq"; None: zmq when enabled, else null
    endpoint: str = "tcp://*:5557"         # a wildcard (*, 0.0.0.0), ipc:// or inproc:// binds; host:port connects
    replay_endpoint: Optional[str] = None  # a ROUTER socket (always bound) resending past batches
    buffer_steps: int = 10_000             # batches kept for replay
    hwm: int = 100_000                     # the PUB socket's high-water mark
    max_queue_size: int = 100_000          # events waiting for the publisher thread
    topic: str = ""
    event_format: str = "map"              # llmkern's: "map" (current vLLM) or "array" (older vLLM)

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(f"--kv-events-config: {name}: expected {expected}, got {getattr(self, name)!r}")

        if not isinstance(self.enable_kv_cache_events, bool):
            bad("enable_kv_cache_events", "true or false")
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        if self.publisher not in ("null", "zmq"):
            bad("publisher", '"null" or "zmq"')
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                bad(name, "a string")
        if "://" not in self.endpoint:
            bad("endpoint", "a ZMQ endpoint such as tcp://*:5557")
        if self.replay_endpoint is not None and (not isinstance(self.replay_endpoint, str)
                                                 or "://" not in self.replay_endpoint):
            bad("replay_endpoint", "a ZMQ endpoint such as tcp://*:5558, or null")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "an integer >= 1")
        if self.event_format not in ("map", "array"):
            bad("event_format", '"map" or "array"')

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The flag's JSON object; a ValueError names the field that is wrong."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--kv-events-config: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"--kv-events-config: expected a JSON object, got {text!r}")
    known = {f.name for f in fields(KVEventsConfig)}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ValueError(f"--kv-events-config: {unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    return KVEventsConfig(**obj)


def kv_events_arg(text: str) -> KVEventsConfig:
    """argparse type: the error message names the field (argparse would print only 'invalid value')."""
    try:
        return parse_kv_events_config(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
