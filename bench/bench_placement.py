"""`python bench/bench_placement.py ...`: runs llmkern.bench.bench_placement (the code and its docs live there)."""
from llmkern.bench.bench_placement import main

raise SystemExit(main())
