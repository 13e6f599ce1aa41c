"""One prefill or decode engine in its own process, for tests/test_pd_engine.py.

argv[1]: JSON {"model": HF config dict (dummy weights), "engine": EngineConfig kwargs (kv_role,
kv_connector spec, ...)}. Reads one JSON command per stdin line:
  {"op": "add", "id": ..., "prompt": [...], "params": {...}, "kv_transfer_params": {...} | null}
  {"op": "stats"} | {"op": "quit"}
and writes one JSON object per stdout line: {"ready": ...} once built, then {"finished": id, ...}
per finished request, {"rejected": id, "error": ...} per bad command, {"stats": {...}}.
Exits when stdin closes (the test process died) or on "quit"."""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import sys
import threading


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    import torch

    import llmkern
    from llmkern.engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(1)
    llmkern.set_num_threads(1)
    eng = Engine(spec["model"], EngineConfig(**spec["engine"]), load_format="dummy")
    emit({"ready": True, "pid": os.getpid(), "engine_id": eng.handover.connector.engine_id})
    cmds: "queue.Queue" = queue.Queue()

    def read():
        for line in sys.stdin:
            cmds.put(json.loads(line))
        cmds.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            cmd = cmds.get(timeout=0.002 if eng.has_unfinished_requests() else 0.1)
        except queue.Empty:
            cmd = {}
        if cmd is None or cmd.get("op") == "quit":
            eng.shutdown()
            return
        if cmd.get("op") == "add":
            try:
                eng.add_request(cmd["prompt"], SamplingParams(**cmd["params"]), request_id=cmd["id"],
                                kv_transfer_params=cmd.get("kv_transfer_params"))
            except (ValueError, TypeError) as e:
                emit({"rejected": cmd["id"], "error": str(e)})
        elif cmd.get("op") == "stats":
            emit({"stats": dataclasses.asdict(eng.stats())})
        if eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    emit({"finished": o.request_id, "token_ids": o.outputs[0].token_ids, "error": o.error,
                          "finish_reason": o.outputs[0].finish_reason, "kv_transfer_params": o.kv_transfer_params,
                          "kv_bytes": o.metrics.kv_transfer_bytes})


if __name__ == "__main__":
    main()
