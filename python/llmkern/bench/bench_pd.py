"""Prefill-decode disaggregation benchmark: steady chat decoding plus bursts of long prompts, the
same requests on a co-located server (2 threads) and on `serve --pd 1P1D` (1 thread per engine);
TTFT and ITL p50/p99 (overall and during bursts), throughput, KV bytes moved and transfer time.
The same as `llmkern bench pd`; see llmkern/bench/disagg.py for the options."""
import sys

SUITE = "standalone"  # several processes / long workloads: run by its own command only


def main(argv=None) -> int:
    from llmkern.bench.disagg import main as pd_main

    return pd_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
