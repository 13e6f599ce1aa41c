"""`python bench/bench_e2e.py ...`: runs llmkern.bench.bench_e2e (the code and its docs live there)."""
from llmkern.bench.bench_e2e import main

raise SystemExit(main())
