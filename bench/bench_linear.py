"""`python bench/bench_linear.py ...`: runs llmkern.bench.bench_linear (the code and its docs live there)."""
from llmkern.bench.bench_linear import main

raise SystemExit(main())
