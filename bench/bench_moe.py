"""`python bench/bench_moe.py ...`: runs llmkern.bench.bench_moe (the code and its docs live there)."""
from llmkern.bench.bench_moe import main

raise SystemExit(main())
