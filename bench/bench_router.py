"""Router benchmark: N replicas of the default model behind `llmkern router`, a multi-tenant
workload with long per-tenant system prompts (uniform and skewed), Poisson arrivals; per policy the
prefix-cache hit rate, TTFT p50/p99, throughput and balance, with `prefix_only` as the oracle.
The same as `llmkern bench router`; see llmkern/router/bench.py for the options."""
import sys

if __name__ == "__main__":
    from llmkern.router.bench import main

    sys.exit(main(sys.argv[1:]))
