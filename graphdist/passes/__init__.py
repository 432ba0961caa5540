"""Graph rewrite passes, one per file (see graphdist/passes/base.py)."""
