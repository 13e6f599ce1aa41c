"""Import-compatible modules: swap one import line to run another library's callers on llmkern."""
