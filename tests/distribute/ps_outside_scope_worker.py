"""A worker that updates a parameter-server variable from a ``gd.function`` without ``strategy.run`` and
outside ``strategy.scope()`` (run by ``graphdist launch --workers 1 --ps 1``); prints the value the ps holds,
and the error a step under another strategy gets."""

from __future__ import annotations

import numpy as np

import graphdist as gd


def main() -> None:
    strategy = gd.ParameterServerStrategy()
    with strategy.scope():
        counter = gd.Variable(np.zeros(3, np.float32), name="counter")

    @gd.function
    def bump(step):
        counter.assign_add(step)

    for _ in range(2):
        bump(np.ones(3, np.float32))
    print("ps holds", counter.numpy().tolist(), flush=True)
    mirrored = gd.MirroredStrategy(["cpu:0"])
    try:
        gd.function(lambda: mirrored.run(lambda: counter.assign_add(np.ones(3, np.float32))))()
    except gd.GraphdistError as err:
        print("other strategy:", err, flush=True)


if __name__ == "__main__":
    main()
