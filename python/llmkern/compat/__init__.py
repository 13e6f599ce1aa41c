"""Import-compatible modules: drop-in replacements for other projects' kernel APIs."""
