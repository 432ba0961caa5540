"""graphdist's version (the tasks of one multi-process job must all run the same)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
