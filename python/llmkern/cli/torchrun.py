"""`python -m llmkern.cli.torchrun ARGS...` under a torchrun-style launcher: rank 0 runs
`llmkern ARGS...` (the engine), every other rank runs the worker loop.

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --master-addr HOST0 --master-port 29500 \\
        -m llmkern.cli.torchrun generate --model DIR -tp 2 -pp 2 --input in.jsonl --output out.jsonl"""
import sys

from ..distributed.launch import env_launch

if __name__ == "__main__":
    env = env_launch()
    if env is not None and env["rank"] != 0:
        from ..distributed.worker import main as worker_main

        worker_main()
    else:
        from . import main

        sys.exit(main(sys.argv[1:]))
