"""python -m llmkern.explore: the same as `llmkern explore`."""
import sys

from .cli import main

sys.exit(main())
