"""`python bench/bench_pd.py ...`: runs llmkern.bench.bench_pd (the code and its docs live there)."""
from llmkern.bench.bench_pd import main

raise SystemExit(main())
