"""Command-line interface: ``graphdist devices | inspect | ...``."""
