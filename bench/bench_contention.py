"""`python bench/bench_contention.py ...`: runs llmkern.bench.bench_contention (the code and its docs live there)."""
from llmkern.bench.bench_contention import main

raise SystemExit(main())
