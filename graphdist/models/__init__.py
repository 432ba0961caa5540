"""Model zoo: step functions with example data."""
