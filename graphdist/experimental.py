"""``gd.experimental``: the strategies tf.distribute lists under ``tf.distribute.experimental``.

``gd.experimental.TPUStrategy`` is ``gd.TPUStrategy``, and so on: the seeds use
both spellings (``tf.distribute.experimental.MultiWorkerMirroredStrategy``).
``gd.experimental.CommunicationOptions`` (``tf.distribute.experimental.CommunicationOptions``)
configures ``MultiWorkerMirroredStrategy``'s collectives. The names are
:mod:`graphdist.distribute.experimental`'s (also ``gd.distribute.experimental.*``).
"""

from graphdist.distribute.experimental import *  # noqa: F403 - the same names, one list
from graphdist.distribute.experimental import __all__  # noqa: F401
