"""`python bench/bench_attention_gpu.py ...`: runs llmkern.bench.bench_attention_gpu (the code and its docs live there)."""
from llmkern.bench.bench_attention_gpu import main

raise SystemExit(main())
