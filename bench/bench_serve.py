"""`python bench/bench_serve.py ...`: runs llmkern.bench.bench_serve (the code and its docs live there)."""
from llmkern.bench.bench_serve import main

raise SystemExit(main())
