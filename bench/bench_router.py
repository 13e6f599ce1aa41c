"""`python bench/bench_router.py ...` = `llmkern bench router ...` (the code and its docs: llmkern/bench/routing.py)."""
from llmkern.bench.routing import main

raise SystemExit(main())
