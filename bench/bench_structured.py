"""`python bench/bench_structured.py ...`: runs llmkern.bench.bench_structured (the code and its docs live there)."""
from llmkern.bench.bench_structured import main

raise SystemExit(main())
