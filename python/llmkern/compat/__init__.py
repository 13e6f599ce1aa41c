"""Import-compatible modules: drop-in replacements for other projects' kernel APIs (swap one
import line to run another library's callers on llmkern)."""
