"""Serving benchmark: `llmkern serve` (each scheduling policy) vs HF's `transformers serve`, open-loop
Poisson load, TTFT/ITL/E2E percentiles and goodput; plus the burst-of-32 server vs in-process ratio.
The same as `llmkern bench serve`; see llmkern/serve/bench.py for the workload and options."""
import argparse
import sys

from llmkern.serve.bench import add_args, main

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(ap)
    sys.exit(main(ap.parse_args()))
