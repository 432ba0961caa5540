"""TensorFlow side of ``benchmarks/bench_keras_fit.py`` (standalone; runs in its own venv).

Keras ``model.fit`` of the benchmark's MLP under ``tf.distribute.MirroredStrategy``
on two logical CPU devices, written the Keras way:

* the physical CPU split into two logical devices and the thread pools set
  before TensorFlow starts (``configure`` of ``tf_mirrored_train.py``, which
  sits next to this file);
* ``MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=...)``; the model
  (``keras.Sequential`` of ``Dense`` layers), its ``SGD`` optimizer and the
  ``accuracy`` metric created and compiled in the strategy's scope; the
  initial weights set from the benchmark's arrays (``model.set_weights``);
* ``model.fit(x, y, batch_size=B, epochs=N, shuffle=True, verbose=0)`` on numpy
  arrays: Keras splits every global batch of ``B`` between the replicas.

Inputs (``--data``): an ``.npz`` with ``x``, ``y``, ``sizes``, ``batch``,
``lr`` and the initial ``w0, b0, w1, b1, ...``. Modes:

* ``--check OUT.npz``: one epoch without shuffling from the initial weights;
  saves ``loss``, ``accuracy`` and ``w0, b0, ...``;
* ``--serve``: each stdin line ``fit N [SAMPLES]`` runs ``model.fit`` for ``N``
  epochs (on the first ``SAMPLES`` rows; default all) and answers one JSON
  line ``{"us_per_call": microseconds per epoch}``; ``quit`` ends. The first
  line written is ``{"ready": true, ...}`` after a warm-up fit (trace and
  compile).

This file imports only TensorFlow, numpy and the standard library::

    .bench-venvs/tf/bin/python benchmarks/tf_keras_fit.py --data DATA.npz --serve
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tf_common.py sits next to this file
from tf_common import load_data  # noqa: E402 - needs the path above

CROSS_DEVICE_OPS = ("default", "reduction_to_one", "hierarchical_copy")




def build(tf, data, cross_device_ops):
    """The strategy and the compiled model with the benchmark's initial weights."""
    from tf_mirrored_train import _cross_device_ops

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=_cross_device_ops(tf, cross_device_ops))
    sizes = [int(s) for s in data["sizes"]]
    keras = tf.keras
    with strategy.scope():
        layers = [keras.Input((sizes[0],))]
        for index, width in enumerate(sizes[1:]):
            last = index == len(sizes) - 2
            layers.append(keras.layers.Dense(width, activation=None if last else "relu"))
        model = keras.Sequential(layers)
        model.compile(optimizer=keras.optimizers.SGD(float(data["lr"])),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    count = len(sizes) - 1
    model.set_weights([data[f"{kind}{i}"] for i in range(count) for kind in ("w", "b")])
    return strategy, model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="npz with x, y, sizes, batch, lr, w0, b0, ...")
    parser.add_argument("--intra-op", type=int, default=1)
    parser.add_argument("--inter-op", type=int, default=2)
    parser.add_argument("--cross-device-ops", choices=CROSS_DEVICE_OPS, default="reduction_to_one")
    parser.add_argument("--check", metavar="OUT")
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args(argv)

    from tf_mirrored_train import configure

    data = load_data(args.data)
    tf = configure(args.intra_op, args.inter_op)
    strategy, model = build(tf, data, args.cross_device_ops)
    x, y, batch = data["x"], data["y"], int(data["batch"])
    if args.check:
        import numpy as np

        history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        weights = model.get_weights()
        out = {"loss": np.float64(history.history["loss"][0]), "accuracy": np.float64(history.history["accuracy"][0])}
        out.update({f"{'wb'[i % 2]}{i // 2}": w for i, w in enumerate(weights)})
        np.savez(args.check, **out)
        print(json.dumps({"tensorflow": tf.__version__, "loss": float(out["loss"])}))
        return 0
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=True, verbose=0)  # trace, compile, warm up
    first = time.perf_counter() - start
    print(json.dumps({"ready": True, "tensorflow": tf.__version__, "keras": tf.keras.__version__,
                      "first_fit_s": first, "replicas": strategy.num_replicas_in_sync,
                      "intra_op": args.intra_op, "inter_op": args.inter_op,
                      "cross_device_ops": args.cross_device_ops}), flush=True)
    if not args.serve:
        return 0
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        if command[0] == "fit" and len(command) in (2, 3):
            epochs = int(command[1])
            rows = int(command[2]) if len(command) == 3 else len(x)
            start = time.perf_counter_ns()
            model.fit(x[:rows], y[:rows], batch_size=batch, epochs=epochs, shuffle=True, verbose=0)
            print(json.dumps({"us_per_call": (time.perf_counter_ns() - start) / epochs / 1e3}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
