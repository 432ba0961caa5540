"""A small convolutional classifier for 8x8 grey images (scikit-learn's digits).

Architecture (NHWC, TensorFlow layouts)::

    x (N, 8, 8, 1)
    conv1: 3x3 SAME, 1 -> 8 channels, ReLU     (N, 8, 8, 8)
    max_pool2d 2x2                             (N, 4, 4, 8)
    conv2: 3x3 SAME, 8 -> 16 channels, ReLU    (N, 4, 4, 16)
    avg_pool2d 2x2                             (N, 2, 2, 16)
    flatten                                    (N, 64)
    dense: 64 -> 10                            (N, 10) logits

1,898 parameters with the defaults. :meth:`ConvNet.forward` is plain numpy
plus ``gd.nn`` (``conv2d``, ``max_pool2d``, ``avg_pool2d``, ``relu``): it runs
eagerly on arrays and is traced inside ``strategy.run`` / ``gd.function``,
where the convolutions and pools become ONNX ``Conv``, ``MaxPool`` and
``AveragePool`` (float32; float64 uses ``gd.nn``'s im2col composite). The
parameters are ``gd.Variable`` s created in the current strategy scope::

    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = ConvNet()
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer)
    x, labels = ConvNet.example_data(n=512)
    loss = strategy.run(step, args=(x[:64], labels[:64]))

The module-level :func:`forward` and :func:`example_inputs` use a default
model so tools can inspect it: ``graphdist inspect graphdist.models.convnet:forward``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

import graphdist as gd
from graphdist.models.common import Classifier, distributed_step, glorot_uniform, he_normal

__all__ = ["ConvNet", "default_model", "example_data", "example_inputs", "forward"]

logger = logging.getLogger(__name__)

#: Number of images in scikit-learn's digits data set.
DIGITS_SIZE = 1797


class ConvNet(Classifier):
    """Two 3x3 convolutions with pooling, then a dense classifier.

    Args:
        image_size: Height and width of the (square) input images; divisible by 4.
        channels: Input channels.
        filters: Output channels of the two convolutions.
        num_classes: Number of logits.
        seed: Seed of the parameter initialisation (He normal kernels, zero biases).
        dtype: Floating-point dtype of the parameters.

    Attributes:
        conv1_kernel, conv1_bias, conv2_kernel, conv2_bias, dense_kernel, dense_bias:
            The ``gd.Variable`` parameters, named ``"convnet/conv1/kernel"`` etc.
            Kernels are HWIO ``(3, 3, C_in, C_out)``.

    Raises:
        ValueError: ``image_size`` is not a positive multiple of 4, a size is
            not positive, or ``dtype`` is not floating point.
    """

    def __init__(self, image_size: int = 8, channels: int = 1, filters: tuple[int, int] = (8, 16),
                 num_classes: int = 10, seed: int = 0, dtype: Any = np.float32) -> None:
        super().__init__("convnet", num_classes, dtype)
        image_size, channels = int(image_size), int(channels)
        f1, f2 = (int(f) for f in filters)
        if image_size <= 0 or image_size % 4:
            raise ValueError(f"ConvNet: image_size must be a positive multiple of 4 (two 2x2 pools), got {image_size}")
        if channels <= 0 or f1 <= 0 or f2 <= 0:
            raise ValueError(f"ConvNet: channels and filters must be positive, got channels={channels}, "
                             f"filters={filters}")
        self.image_size, self.channels, self.filters = image_size, channels, (f1, f2)
        flat = (image_size // 4) ** 2 * f2
        rng = np.random.default_rng(seed)
        dt = self.dtype
        self.conv1_kernel = self.add_variable(he_normal(rng, (3, 3, channels, f1), 9 * channels, dt), "conv1/kernel")
        self.conv1_bias = self.add_variable(np.zeros(f1, dt), "conv1/bias")
        self.conv2_kernel = self.add_variable(he_normal(rng, (3, 3, f1, f2), 9 * f1, dt), "conv2/kernel")
        self.conv2_bias = self.add_variable(np.zeros(f2, dt), "conv2/bias")
        self.dense_kernel = self.add_variable(glorot_uniform(rng, (flat, self.num_classes), flat, self.num_classes,
                                                             dt), "dense/kernel")
        self.dense_bias = self.add_variable(np.zeros(self.num_classes, dt), "dense/bias")
        logger.debug("built %r (%d parameters)", self, self.num_parameters)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one image, ``(H, W, C)``."""
        return (self.image_size, self.image_size, self.channels)

    def forward(self, x: Any, training: bool = False) -> Any:
        """Logits of a batch of NHWC images.

        Args:
            x: Images ``(batch, image_size, image_size, channels)``.
            training: Accepted for a uniform model interface (the ConvNet has no
                training-only layers).

        Returns:
            Logits ``(batch, num_classes)``.

        Raises:
            ValueError: ``x`` does not have the shape ``(batch, *input_shape)``.
        """
        shape = tuple(x.shape)
        if len(shape) != 4 or shape[1:] != self.input_shape:
            raise ValueError(f"ConvNet expects images of shape (batch, {', '.join(map(str, self.input_shape))}) "
                             f"(NHWC), got {shape}")
        h = gd.nn.relu(gd.nn.conv2d(x, self.conv1_kernel, self.conv1_bias, padding="SAME"))
        h = gd.nn.max_pool2d(h, 2)
        h = gd.nn.relu(gd.nn.conv2d(h, self.conv2_kernel, self.conv2_bias, padding="SAME"))
        h = gd.nn.avg_pool2d(h, 2)
        h = h.reshape(shape[0], (self.image_size // 4) ** 2 * self.filters[1])
        return h @ self.dense_kernel + self.dense_bias

    @staticmethod
    def example_data(n: int = 512, seed: int = 0, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """``n`` images of scikit-learn's handwritten digits (a seeded shuffle).

        Args:
            n: Number of examples, at most 1797 (the size of the data set).
            seed: Seed of the shuffle.
            dtype: dtype of the images.

        Returns:
            ``(x, labels)``: images ``(n, 8, 8, 1)`` scaled to [0, 1] and int64
            labels in ``[0, 10)``.

        Raises:
            ValueError: ``n`` is not in ``[1, 1797]``.
            ImportError: scikit-learn is not installed (``pip install 'graphdist[data]'``).
        """
        if not 1 <= int(n) <= DIGITS_SIZE:
            raise ValueError(f"ConvNet.example_data: n must be in [1, {DIGITS_SIZE}] (the digits data set), got {n}")
        try:
            from sklearn.datasets import load_digits
        except ImportError as err:  # pragma: no cover - scikit-learn is part of the test/data extras
            raise ImportError("ConvNet.example_data needs scikit-learn (the digits data set): "
                              "pip install 'graphdist[data]'") from err
        digits = load_digits()
        order = np.random.default_rng(seed).permutation(len(digits.target))[: int(n)]
        x = (digits.images[order] / 16.0).astype(dtype)[..., None]
        return x, digits.target[order].astype(np.int64)

    def __repr__(self) -> str:
        return (f"ConvNet(image_size={self.image_size}, channels={self.channels}, filters={self.filters}, "
                f"num_classes={self.num_classes}, dtype={self.dtype.name})")


_default: ConvNet | None = None


def default_model() -> ConvNet:
    """The module's default model: ``ConvNet(seed=0)``, built once (in the strategy current at that time)."""
    global _default
    if _default is None:
        _default = ConvNet(seed=0)
    return _default


def forward(x: Any) -> Any:
    """:meth:`ConvNet.forward` of :func:`default_model` (images ``(batch, 8, 8, 1)``)."""
    return default_model().forward(x)


def example_data(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`ConvNet.example_data`: ``n`` digits images and their labels."""
    return ConvNet.example_data(n=n, seed=seed)


def example_inputs(batch: int = 8, seed: int = 0) -> tuple[np.ndarray]:
    """Example inputs for :func:`forward`: ``(batch, 8, 8, 1)`` float32 digits images."""
    return (ConvNet.example_data(n=batch, seed=seed)[0],)


def make_step(strategy: Any, batch: int = 16, seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A whole distributed training step of a default :class:`ConvNet` under ``strategy`` (for tools).

    ``graphdist inspect graphdist.models.convnet:make_step --strategy mirrored --devices cpu:0,cpu:1``
    calls it: model and Adam optimizer created in ``strategy.scope()``, the
    replica step :meth:`ConvNet.make_train_step` on every replica, the loss
    summed over replicas.

    Returns:
        ``(step, example_args)``: the ``gd.function`` and one global batch
        ``(images, labels)`` of ``batch`` digits, distributed across the replicas.
    """
    with strategy.scope():
        model = ConvNet(seed=seed)
        optimizer = gd.optimizers.Adam(0.01)
    x, labels = ConvNet.example_data(n=batch, seed=seed)
    return distributed_step(strategy, model.make_train_step(optimizer), x, labels, "convnet_train_step")


__all__ += ["make_step"]
