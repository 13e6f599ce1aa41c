"""Router benchmark: N replicas of the default model behind `llmkern router`, a multi-tenant
workload with long per-tenant system prompts (uniform and skewed), Poisson arrivals; per policy the
prefix-cache hit rate, TTFT p50/p99, throughput and balance, with `prefix_only` as the oracle.
The same as `llmkern bench router`; see llmkern/bench/routing.py for the options."""
import sys

SUITE = "standalone"  # several processes / long workloads: run by its own command only


def main(argv=None) -> int:
    from llmkern.bench.routing import main as router_main

    return router_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
