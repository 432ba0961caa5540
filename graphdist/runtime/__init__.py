"""Runtime: devices, the plan scheduler and communicators."""
