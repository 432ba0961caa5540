"""``gd.tpu``: tf.tpu's names for the TPU-like system (``gd.tpu.experimental.initialize_tpu_system``...).

The cores are simulated on the host: see :mod:`graphdist.distribute.tpu`.
"""

from graphdist.tpu import experimental

__all__ = ["experimental"]
