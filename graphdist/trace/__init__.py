"""Tracing numpy-style Python functions into graphdist graphs."""

from graphdist.trace.tensor import Tensor
from graphdist.trace.tracer import TensorSpec, TraceContext, current_trace, is_tracing, trace

__all__ = ["Tensor", "TensorSpec", "TraceContext", "trace", "current_trace", "is_tracing"]
