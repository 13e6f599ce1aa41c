"""`python bench/bench_pd.py ...` = `llmkern bench pd ...` (the code and its docs: llmkern/bench/disagg.py)."""
from llmkern.bench.disagg import main

raise SystemExit(main())
