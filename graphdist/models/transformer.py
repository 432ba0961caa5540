"""One transformer encoder block classifying short token sequences.

Architecture (post-norm, as in "Attention is all you need")::

    ids (N, T) int
    h = token_embedding[ids] + position_embedding[:T]             (N, T, D)
    a = MultiHeadSelfAttention(h)   (q/k/v projections, softmax(q k^T / sqrt(D/H)) v, output projection)
    h = layer_norm(h + a)
    m = gelu(h @ W1 + b1) @ W2 + b2                                (hidden width F)
    h = layer_norm(h + m)
    logits = mean(h, axis=1) @ Wc + bc                             (N, num_classes)

With the defaults (vocabulary 16, length 8, D = 32, 2 heads, F = 64, 4
classes) the model has 9,444 parameters. Attention is written with
``np.matmul``, ``reshape`` and ``transpose`` only and the rest with ``gd.nn``
(``embedding``, ``softmax``, ``layer_norm``, ``gelu``), so
:meth:`TransformerBlock.forward` runs eagerly on arrays and is traced inside
``strategy.run`` / ``gd.function``::

    strategy = gd.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = TransformerBlock()
        optimizer = gd.optimizers.Adam(0.01)
    step = model.make_train_step(optimizer)
    ids, labels = TransformerBlock.example_data(n=512)
    loss = strategy.run(step, args=(ids[:64], labels[:64]))

The example task (:meth:`TransformerBlock.example_data`): which of the
"class tokens" ``0 .. num_classes-1`` occurs most often in the sequence (the
other tokens are distractors; ties never occur). The module-level
:func:`forward` and :func:`example_inputs` use a default model:
``graphdist inspect graphdist.models.transformer:forward``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

import graphdist as gd
from graphdist.models.common import Classifier, distributed_step, glorot_uniform

__all__ = ["TransformerBlock", "default_model", "example_data", "example_inputs", "forward"]

logger = logging.getLogger(__name__)


class TransformerBlock(Classifier):
    """Token + position embeddings, one post-norm encoder block, mean pooling, a linear classifier.

    Args:
        vocab_size: Number of token ids.
        max_length: Longest sequence (rows of the position embedding).
        d_model: Width of the embeddings and of the block.
        num_heads: Attention heads; must divide ``d_model``.
        d_ff: Hidden width of the block's MLP.
        num_classes: Number of logits.
        seed: Seed of the parameter initialisation (Glorot-uniform matrices,
            normal(0, 0.1) embeddings, zero biases, unit layer-norm scales).
        dtype: Floating-point dtype of the parameters.

    Attributes:
        token_embedding, position_embedding, query_kernel, ... : The
            ``gd.Variable`` parameters, named ``"transformer/attention/query/kernel"`` etc.

    Raises:
        ValueError: A size is not positive, ``num_heads`` does not divide
            ``d_model``, or ``dtype`` is not floating point.
    """

    def __init__(self, vocab_size: int = 16, max_length: int = 8, d_model: int = 32, num_heads: int = 2,
                 d_ff: int = 64, num_classes: int = 4, seed: int = 0, dtype: Any = np.float32) -> None:
        super().__init__("transformer", num_classes, dtype)
        sizes = {"vocab_size": vocab_size, "max_length": max_length, "d_model": d_model, "num_heads": num_heads,
                 "d_ff": d_ff}
        bad = {k: v for k, v in sizes.items() if int(v) <= 0}
        if bad:
            raise ValueError(f"TransformerBlock: sizes must be positive, got {bad}")
        if d_model % num_heads:
            raise ValueError(f"TransformerBlock: num_heads ({num_heads}) must divide d_model ({d_model})")
        self.vocab_size, self.max_length = int(vocab_size), int(max_length)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        d, f, c, dt = self.d_model, self.d_ff, self.num_classes, self.dtype
        rng = np.random.default_rng(seed)

        def matrix(rows: int, cols: int, name: str) -> gd.Variable:
            return self.add_variable(glorot_uniform(rng, (rows, cols), rows, cols, dt), name)

        def vector(size: int, name: str, value: float = 0.0) -> gd.Variable:
            return self.add_variable(np.full(size, value, dt), name)

        self.token_embedding = self.add_variable((rng.standard_normal((self.vocab_size, d)) * 0.1).astype(dt),
                                                 "embedding/tokens")
        self.position_embedding = self.add_variable((rng.standard_normal((self.max_length, d)) * 0.1).astype(dt),
                                                    "embedding/positions")
        self.query_kernel, self.query_bias = matrix(d, d, "attention/query/kernel"), vector(d, "attention/query/bias")
        self.key_kernel, self.key_bias = matrix(d, d, "attention/key/kernel"), vector(d, "attention/key/bias")
        self.value_kernel, self.value_bias = matrix(d, d, "attention/value/kernel"), vector(d, "attention/value/bias")
        self.output_kernel = matrix(d, d, "attention/output/kernel")
        self.output_bias = vector(d, "attention/output/bias")
        self.norm1_gamma, self.norm1_beta = vector(d, "norm1/gamma", 1.0), vector(d, "norm1/beta")
        self.mlp_kernel1, self.mlp_bias1 = matrix(d, f, "mlp/dense1/kernel"), vector(f, "mlp/dense1/bias")
        self.mlp_kernel2, self.mlp_bias2 = matrix(f, d, "mlp/dense2/kernel"), vector(d, "mlp/dense2/bias")
        self.norm2_gamma, self.norm2_beta = vector(d, "norm2/gamma", 1.0), vector(d, "norm2/beta")
        self.classifier_kernel = matrix(d, c, "classifier/kernel")
        self.classifier_bias = vector(c, "classifier/bias")
        logger.debug("built %r (%d parameters)", self, self.num_parameters)

    # ------------------------------------------------------------ layers
    def _split_heads(self, h: Any, batch: int, length: int) -> Any:
        """``(N, T, D)`` -> ``(N, H, T, D/H)``."""
        return np.transpose(h.reshape(batch, length, self.num_heads, self.d_model // self.num_heads), (0, 2, 1, 3))

    def attention(self, h: Any, return_weights: bool = False) -> Any:
        """Multi-head self-attention of ``h`` ``(N, T, D)`` (no mask).

        Returns:
            The projected attention output ``(N, T, D)``; with
            ``return_weights`` also the weights ``(N, H, T, T)``.
        """
        batch, length = h.shape[0], h.shape[1]
        q = self._split_heads(h @ self.query_kernel + self.query_bias, batch, length)
        k = self._split_heads(h @ self.key_kernel + self.key_bias, batch, length)
        v = self._split_heads(h @ self.value_kernel + self.value_bias, batch, length)
        scale = np.asarray(1.0 / math.sqrt(self.d_model // self.num_heads), dtype=self.dtype)
        scores = (q @ np.transpose(k, (0, 1, 3, 2))) * scale  # (N, H, T, T)
        weights = gd.nn.softmax(scores, axis=-1)
        heads = weights @ v  # (N, H, T, D/H)
        merged = np.transpose(heads, (0, 2, 1, 3)).reshape(batch, length, self.d_model)
        out = merged @ self.output_kernel + self.output_bias
        return (out, weights) if return_weights else out

    def encode(self, ids: Any) -> Any:
        """Embeddings plus the encoder block: ``(N, T)`` ids -> ``(N, T, D)``."""
        shape = tuple(ids.shape)
        if len(shape) != 2 or not 1 <= shape[1] <= self.max_length:
            raise ValueError(f"TransformerBlock expects token ids of shape (batch, length) with length <= "
                             f"{self.max_length}, got {shape}")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"TransformerBlock expects integer token ids, got dtype {ids.dtype}")
        h = gd.nn.embedding(ids, self.token_embedding) + self.position_embedding[: shape[1]]
        h = gd.nn.layer_norm(h + self.attention(h), self.norm1_gamma, self.norm1_beta)
        m = gd.nn.gelu(h @ self.mlp_kernel1 + self.mlp_bias1) @ self.mlp_kernel2 + self.mlp_bias2
        return gd.nn.layer_norm(h + m, self.norm2_gamma, self.norm2_beta)

    def forward(self, x: Any, training: bool = False) -> Any:
        """Logits of a batch of token sequences.

        Args:
            x: Integer token ids ``(batch, length)``, ``length <= max_length``,
                values in ``[0, vocab_size)``.
            training: Accepted for a uniform model interface (the block has no
                dropout).

        Returns:
            Logits ``(batch, num_classes)``.

        Raises:
            ValueError: ``x`` is not a 2-D integer array of a supported length.
        """
        pooled = np.mean(self.encode(x), axis=1)
        return pooled @ self.classifier_kernel + self.classifier_bias

    # -------------------------------------------------------------- data
    @staticmethod
    def example_data(n: int = 512, seed: int = 0, length: int = 8, vocab_size: int = 16,
                     num_classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """Sequences labelled with their most frequent class token.

        Each position holds one of the class tokens ``0 .. num_classes-1``
        with probability 1/2, else a distractor token from ``num_classes ..
        vocab_size-1``; sequences whose most frequent class token is tied (or
        that hold none) are redrawn. The label is that most frequent class
        token. A model must count tokens across positions: attention (or the
        mean pooling after it) has to gather the whole sequence. Chance
        accuracy is about ``1 / num_classes``.

        Args:
            n: Number of sequences.
            seed: Seed of the generator.
            length: Sequence length.
            vocab_size: Number of token ids (> ``num_classes``).
            num_classes: Number of class tokens (and labels).

        Returns:
            ``(ids, labels)``: int64 arrays ``(n, length)`` and ``(n,)``.

        Raises:
            ValueError: Bad sizes.
        """
        n, length, vocab_size, num_classes = int(n), int(length), int(vocab_size), int(num_classes)
        if n < 1 or length < 1 or num_classes < 2 or vocab_size <= num_classes:
            raise ValueError(f"TransformerBlock.example_data: need n >= 1, length >= 1, num_classes >= 2 and "
                             f"vocab_size > num_classes; got n={n}, length={length}, vocab_size={vocab_size}, "
                             f"num_classes={num_classes}")
        rng = np.random.default_rng(seed)
        ids = np.empty((0, length), np.int64)
        labels = np.empty(0, np.int64)
        while len(labels) < n:
            draw = 2 * (n - len(labels)) + 16
            is_class = rng.random((draw, length)) < 0.5
            batch = np.where(is_class, rng.integers(0, num_classes, (draw, length)),
                             rng.integers(num_classes, vocab_size, (draw, length)))
            counts = (batch[:, :, None] == np.arange(num_classes)).sum(axis=1)  # (draw, classes)
            top = counts.max(axis=1)
            unique = (counts == top[:, None]).sum(axis=1) == 1
            keep = unique & (top > 0)
            ids = np.concatenate([ids, batch[keep]])
            labels = np.concatenate([labels, counts[keep].argmax(axis=1)])
        return ids[:n], labels[:n].astype(np.int64)

    @staticmethod
    def get_layout_map(device_mesh: Any, model_dim: str = "model") -> Any:
        """Megatron's tensor parallelism for this block (keras_hub's ``get_layout_map``): the attention's
        heads and the MLP's hidden units split over ``model_dim`` of ``device_mesh``: query/key/value and the
        first MLP layer by columns (their biases too), the attention's output and the second MLP layer by rows.

        Returns:
            A ``gd.experimental.LayoutMap`` for ``ModelParallelStrategy``.
        """
        layout_map = gd.experimental.LayoutMap(device_mesh)
        layout_map["attention/(query|key|value)/kernel"] = (None, model_dim)  # heads split
        layout_map["attention/(query|key|value)/bias"] = (model_dim,)
        layout_map["attention/output/kernel"] = (model_dim, None)
        layout_map["mlp/dense1/kernel"] = (None, model_dim)
        layout_map["mlp/dense1/bias"] = (model_dim,)
        layout_map["mlp/dense2/kernel"] = (model_dim, None)
        return layout_map

    def __repr__(self) -> str:
        return (f"TransformerBlock(vocab_size={self.vocab_size}, max_length={self.max_length}, "
                f"d_model={self.d_model}, num_heads={self.num_heads}, d_ff={self.d_ff}, "
                f"num_classes={self.num_classes}, dtype={self.dtype.name})")


_default: TransformerBlock | None = None


def default_model() -> TransformerBlock:
    """The module's default model: ``TransformerBlock(seed=0)``, built once (in the strategy current then)."""
    global _default
    if _default is None:
        _default = TransformerBlock(seed=0)
    return _default


def forward(x: Any) -> Any:
    """:meth:`TransformerBlock.forward` of :func:`default_model` (ids ``(batch, 8)`` in ``[0, 16)``)."""
    return default_model().forward(x)


def example_data(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`TransformerBlock.example_data` for the default sizes."""
    return TransformerBlock.example_data(n=n, seed=seed)


def example_inputs(batch: int = 8, seed: int = 0) -> tuple[np.ndarray]:
    """Example inputs for :func:`forward`: ``(batch, 8)`` int64 token ids."""
    return (TransformerBlock.example_data(n=batch, seed=seed)[0],)


def make_step(strategy: Any, batch: int = 16, seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """A whole distributed training step of a default :class:`TransformerBlock` under ``strategy`` (for tools).

    ``graphdist inspect graphdist.models.transformer:make_step --strategy mirrored --devices cpu:0,cpu:1``
    calls it: model and Adam optimizer created in ``strategy.scope()``, the
    replica step :meth:`TransformerBlock.make_train_step` on every replica,
    the loss summed over replicas.

    Returns:
        ``(step, example_args)``: the ``gd.function`` and one global batch
        ``(ids, labels)`` of ``batch`` sequences, distributed across the replicas.
    """
    with strategy.scope():
        model = TransformerBlock(seed=seed)
        optimizer = gd.optimizers.Adam(0.01)
    x, labels = TransformerBlock.example_data(n=batch, seed=seed)
    return distributed_step(strategy, model.make_train_step(optimizer), x, labels, "transformer_train_step")


__all__ += ["make_step"]
