"""`python -m llmkern.cli ...`: the same as the `llmkern` command."""
import sys

from . import main

sys.exit(main())
