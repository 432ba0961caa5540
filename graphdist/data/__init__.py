"""Input pipelines (``gd.data``), the numpy counterpart of ``tf.data``.

``gd.data.Dataset`` builds re-iterable pipelines of numpy nests; distribute
them with ``strategy.experimental_distribute_dataset`` or
``strategy.distribute_datasets_from_function``.
"""

from graphdist.data.dataset import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, as_dataset

__all__ = ["Dataset", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "as_dataset"]
