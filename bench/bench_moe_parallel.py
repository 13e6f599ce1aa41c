"""`python bench/bench_moe_parallel.py ...`: runs llmkern.bench.bench_moe_parallel (the code and its docs live there)."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads, as the module itself does
from llmkern.bench.bench_moe_parallel import main  # noqa: E402

raise SystemExit(main())
