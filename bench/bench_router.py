"""`python bench/bench_router.py ...`: runs llmkern.bench.bench_router (the code and its docs live there)."""
from llmkern.bench.bench_router import main

raise SystemExit(main())
