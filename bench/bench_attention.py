"""`python bench/bench_attention.py ...`: runs llmkern.bench.bench_attention (the code and its docs live there)."""
from llmkern.bench.bench_attention import main

raise SystemExit(main())
