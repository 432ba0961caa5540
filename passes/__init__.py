"""Graph rewrite passes, one per file (see passes/base.py)."""
