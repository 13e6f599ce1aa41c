"""`python -m llmkern.bench ...`: the same as `llmkern bench ...`."""
import sys

from .cli import main

sys.exit(main())
