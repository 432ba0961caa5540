"""``gd.debugging``: TensorFlow's ``tf.debugging`` switches for finding where NaN and infinity come from.

::

    gd.debugging.enable_check_numerics()
    loss = train_step(x, y)      # a NaN or Inf anywhere in the step raises gd.NumericsError naming the op
    gd.debugging.disable_check_numerics()

While the checks are on, every floating-point value that each compiled
segment of a step computes for the others is checked after it is computed;
the first NaN or infinity ends the step with
:class:`~graphdist.errors.NumericsError` (an ``InvalidArgumentError``, as in
TF, and a ``FloatingPointError``) once the step's tasks have run. The segment
is then run again with every intermediate value exposed, so the message names
the op that made the first NaN or infinity (its type, node name and the line
of user code that traced it), the step (its function's name and which call),
the device, and whether the op's inputs were finite (the op made it) or were
fed already holding it (the batch, or a variable). The step's results are not
returned and its variable updates are not written, so the variables keep the
values of the last good step.

The switch is global to the process and read once per step: steps compiled
before it was turned on are checked too. Off (the default), nothing is
checked and steps run as fast as without this module. See also
``gd.keras.callbacks.TerminateOnNaN`` (stop ``fit`` when the loss is NaN or
Inf) and the warning ``Checkpoint.save`` and ``model.save`` give when a
weight holds NaN or Inf.
"""

from __future__ import annotations

from graphdist.runtime import numerics

__all__ = ["enable_check_numerics", "disable_check_numerics", "check_numerics_enabled"]


def enable_check_numerics(stack_height_limit: int = 30, path_length_limit: int = 50) -> None:
    """Checks every step from now on for NaN and infinity (TF's ``tf.debugging.enable_check_numerics``).

    Args:
        stack_height_limit: Accepted for TF compatibility; graphdist names the one line of user code
            that traced the op.
        path_length_limit: Accepted for TF compatibility (graphdist names files by their base name).
    """
    del stack_height_limit, path_length_limit
    numerics.enable()


def disable_check_numerics() -> None:
    """Turns the checks off again (the default)."""
    numerics.disable()


def check_numerics_enabled() -> bool:
    """Whether :func:`enable_check_numerics` is in effect."""
    return numerics.enabled()
