"""Real example data shipped inside installed packages (no downloads).

:func:`digits` splits scikit-learn's bundled handwritten digits (1,797 8x8
images, 10 classes) into a deterministic train/test split, features scaled to
``[0, 1]``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Split", "digits"]


class Split(NamedTuple):
    """A train/test split of features and integer labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits(test_fraction: float = 0.2, seed: int = 0, dtype: type = np.float32, images: bool = False) -> Split:
    """scikit-learn's digits, shuffled with ``seed`` and split.

    Args:
        test_fraction: Share of samples held out for testing.
        seed: Seed of the shuffle.
        dtype: Feature dtype.
        images: Return ``(n, 8, 8, 1)`` images (NHWC) instead of 64 features.

    Returns:
        A :class:`Split`; labels are int64 in ``[0, 10)``.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(dtype)
    if images:
        x = x.reshape(-1, 8, 8, 1)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(round(len(x) * (1.0 - test_fraction)))
    return Split(x[:cut], y[:cut], x[cut:], y[cut:])
