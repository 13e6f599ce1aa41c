"""`python bench/bench_sampling.py ...`: runs llmkern.bench.bench_sampling (the code and its docs live there)."""
from llmkern.bench.bench_sampling import main

raise SystemExit(main())
