"""Integrations with other frameworks (optional dependencies, imported on use)."""
