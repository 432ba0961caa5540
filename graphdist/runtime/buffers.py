"""Host buffers the backends can share without copies.

TVM imports a numpy array through DLPack only when its buffer is 64-byte
aligned (and writable); variables keep their values in such buffers, and
feeds that are not get one aligned copy (numpy's copy is far cheaper than
TVM's own ``tvm.runtime.tensor`` upload).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BUFFER_ALIGNMENT", "aligned", "is_aligned"]

#: Byte alignment of buffers shared with TVM (and good for any vector unit up to AVX-512).
BUFFER_ALIGNMENT = 64


def is_aligned(array: np.ndarray) -> bool:
    """True when ``array``'s buffer is C-contiguous and ``BUFFER_ALIGNMENT``-byte aligned."""
    return bool(array.flags.c_contiguous and array.ctypes.data % BUFFER_ALIGNMENT == 0)


def aligned(array: np.ndarray, copy: bool = False) -> np.ndarray:
    """``array`` itself when its buffer is C-contiguous and 64-byte aligned (and ``copy`` is false), else an
    aligned (writable) copy.
    """
    if is_aligned(array) and not copy:
        return array
    raw = np.empty(array.nbytes + BUFFER_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % BUFFER_ALIGNMENT
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
