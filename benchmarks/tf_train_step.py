"""TensorFlow side of ``benchmarks/bench_train_step.py`` (standalone; runs in its own venv).

The MLP training step of the benchmark written in TensorFlow: raw
``tf.Variable`` weights created in the default strategy's scope, the forward
pass, ``tf.nn.sparse_softmax_cross_entropy_with_logits`` averaged over the
global batch (``tf.nn.compute_average_loss``), ``tf.GradientTape`` gradients
and a plain SGD update (``v.assign_sub(lr * g)``, what ``SGD(momentum=0)``
does), all in one ``tf.function`` (default ``jit_compile``) that calls
``tf.distribute.get_strategy().run(replica_step, ...)``, the TF idiom.

This file imports only TensorFlow, numpy and the standard library: it runs in
a separate environment (TensorFlow and ONNX Runtime are not installed side by
side), started by the benchmark as a subprocess::

    .bench-venvs/tf/bin/python benchmarks/tf_train_step.py --data DATA.npz --serve

Inputs (``--data``): an ``.npz`` written by the benchmark with ``x``,
``labels``, ``lr``, ``global_batch`` and the initial ``w0, b0, w1, b1, ...``
(so the three implementations start from identical arrays). Without
``--data`` the script makes its own He-initialised 784-512-512-10 MLP and a
random batch of 256.

Modes:

* ``--check OUT.npz``: run one step from the initial weights and save the
  updated weights (``w0, b0, ...``) and the loss, to compare with numpy.
* ``--serve``: a line protocol for interleaved timing. Each line read from
  stdin is ``run CALLS`` (time ``CALLS`` steps back to back) or ``quit``;
  each answer is one JSON line ``{"us_per_call": ...}``. The first line
  written is ``{"ready": ..., "tensorflow": VERSION, ...}`` after warm-up.
* otherwise: ``--rounds`` rounds of ``--calls`` steps, one JSON object with
  the per-round microseconds per call on stdout.

Threads: ``--intra-op`` (default 2) and ``--inter-op`` (default 1, like
graphdist's sequential ONNX Runtime sessions), set before TensorFlow runs anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter goes to stderr otherwise
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tf_common.py sits next to this file
from tf_common import load_data, time_calls  # noqa: E402 - needs the path above


def build(data, intra_op, inter_op):
    """Returns ``(tf, step, variables, x, labels)``; ``step()`` runs one training step and returns the loss."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    strategy = tf.distribute.get_strategy()  # the default strategy
    layers = sum(1 for key in data if key.startswith("w"))
    with strategy.scope():
        variables = []
        for i in range(layers):
            variables.append(tf.Variable(data[f"w{i}"], name=f"dense_{i}/kernel"))
            variables.append(tf.Variable(data[f"b{i}"], name=f"dense_{i}/bias"))
    lr = tf.constant(float(data["lr"]), tf.float32)
    global_batch = int(data["global_batch"])

    def replica_step(x, labels):
        with tf.GradientTape() as tape:
            h = x
            for i in range(layers):
                h = tf.matmul(h, variables[2 * i]) + variables[2 * i + 1]
                if i + 1 < layers:
                    h = tf.nn.relu(h)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, variables)
        for variable, grad in zip(variables, grads):
            variable.assign_sub(lr * grad)
        return loss

    @tf.function  # jit_compile left at its default (no XLA)
    def train_step(x, labels):
        return strategy.run(replica_step, args=(x, labels))

    x = tf.constant(data["x"])
    labels = tf.constant(data["labels"])

    def step():
        return train_step(x, labels).numpy()  # .numpy(): the loss is on the host, like graphdist's

    return tf, step, variables




def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="npz with x, labels, lr, global_batch, w0, b0, ... (default: built in)")
    parser.add_argument("--intra-op", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads (default 1)")
    parser.add_argument("--check", metavar="OUT", help="one step from the initial weights; save them to OUT (.npz)")
    parser.add_argument("--serve", action="store_true", help="line protocol on stdin/stdout (see the docstring)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)

    data = load_data(args.data)
    tf, step, variables = build(data, args.intra_op, args.inter_op)
    if args.check:
        import numpy as np

        loss = step()
        out = {"loss": np.float32(loss)}
        for i, variable in enumerate(variables):
            out[f"{'wb'[i % 2]}{i // 2}"] = variable.numpy()
        np.savez(args.check, **out)
        print(json.dumps({"loss": float(loss), "tensorflow": tf.__version__}))
        return 0

    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start  # trace + first run
    for _ in range(args.warmup):
        step()
    info = {"tensorflow": tf.__version__, "intra_op": args.intra_op, "inter_op": args.inter_op,
            "first_call_s": first_s, "strategy": type(tf.distribute.get_strategy()).__name__}
    if args.serve:
        print(json.dumps({"ready": True, **info}), flush=True)
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "quit":
                break
            if command[0] == "run":
                print(json.dumps({"us_per_call": time_calls(step, int(command[1]))}), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
        return 0
    rounds = [time_calls(step, args.calls) for _ in range(args.rounds)]
    print(json.dumps({**info, "calls": args.calls, "us_per_call": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
