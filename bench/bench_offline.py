"""`python bench/bench_offline.py ...`: runs llmkern.bench.bench_offline (the code and its docs live there)."""
from llmkern.bench.bench_offline import main

raise SystemExit(main())
