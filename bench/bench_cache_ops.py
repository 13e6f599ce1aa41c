"""`python bench/bench_cache_ops.py ...`: runs llmkern.bench.bench_cache_ops (the code and its docs live there)."""
from llmkern.bench.bench_cache_ops import main

raise SystemExit(main())
