"""Corrected ``onnx.reference`` kernels for ops that onnx 1.23's reference computes wrongly.

The reference backend is graphdist's correctness oracle, so its known wrong
answers are replaced (``ReferenceEvaluator(new_ops=...)`` overrides the
built-in kernel of the same name and domain). Each kernel follows the ONNX
operator specification; the tests compare them with ONNX Runtime.

* ``LRN``: onnx 1.23 sums the squares over the wrong axis when the batch size
  differs from the channel count (and handles only 4-D inputs).
* ``GlobalMaxPool``: onnx 1.23 is wrong for inputs that are not 4-D.
* ``Erf``: onnx 1.23 computes it in float32 even for float64 inputs.
"""

from __future__ import annotations

import math

import numpy as np
from onnx.reference.op_run import OpRun

__all__ = ["REFERENCE_FIXES"]


class LRN(OpRun):
    """Local response normalization over channels (axis 1), any rank >= 3."""

    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):  # noqa: D102 - OpRun's signature
        alpha = 1e-4 if alpha is None else alpha
        beta = 0.75 if beta is None else beta
        bias = 1.0 if bias is None else bias
        squares = np.square(x.astype(np.float64))
        channels = x.shape[1]
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        total = np.zeros_like(squares)
        for c in range(channels):
            low, high = max(0, c - before), min(channels, c + after + 1)
            total[:, c] = squares[:, low:high].sum(axis=1)
        return ((x / np.power(bias + alpha / size * total, beta)).astype(x.dtype),)


class GlobalMaxPool(OpRun):
    """Max over every spatial axis (2 and later), kept as size-1 axes."""

    op_domain = ""

    def _run(self, x):  # noqa: D102 - OpRun's signature
        return (np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True),)


_erf = np.vectorize(math.erf, otypes=[np.float64])


class Erf(OpRun):
    """The error function in the input's precision (float64 stays float64)."""

    op_domain = ""

    def _run(self, x):  # noqa: D102 - OpRun's signature
        if x.dtype.kind != "f":
            return (_erf(x).astype(x.dtype),)
        return (_erf(x.astype(np.float64)).astype(x.dtype),)


#: The kernels the reference backend always registers.
REFERENCE_FIXES: list[type[OpRun]] = [LRN, GlobalMaxPool, Erf]
