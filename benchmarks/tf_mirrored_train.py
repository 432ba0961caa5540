"""TensorFlow side of ``benchmarks/bench_mirrored_train.py`` (standalone; runs in its own venv).

The MLP training step of the benchmark under ``tf.distribute.MirroredStrategy``
on two logical CPU devices, and under TensorFlow's default strategy for
reference. Both are written the TF way:

* the physical CPU is split into two logical devices with
  ``tf.config.set_logical_device_configuration(cpu, [LogicalDeviceConfiguration()] * 2)``
  (before TensorFlow initialises its devices);
* ``tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=...)``;
  ``--cross-device-ops`` picks the all-reduce: ``default`` (what TensorFlow
  chooses itself: ``CollectiveAllReduce`` on a CPU-only machine),
  ``reduction_to_one`` (``ReductionToOneDevice``) or ``hierarchical_copy``
  (``HierarchicalCopyAllReduce``); NCCL is GPU-only;
* ``tf.Variable`` weights created in the strategy's scope from the benchmark's
  arrays (so every implementation starts from identical weights);
* inputs: ``tf.data.Dataset.from_tensors((x, labels)).repeat().prefetch(2)``,
  each element one global batch, through
  ``strategy.experimental_distribute_dataset`` (which splits it into one
  slice per replica and prefetches to the devices), the iterator passed to
  the ``tf.function``, which calls ``next()`` on it (as Keras' ``fit`` does);
* the replica step: forward pass, ``tf.nn.sparse_softmax_cross_entropy_with_logits``
  averaged over the global batch (``tf.nn.compute_average_loss``), gradients
  from ``tf.GradientTape``, summed over replicas with
  ``ReplicaContext.all_reduce(SUM, grads)`` (one batched all-reduce through
  the strategy's cross-device ops, what an optimizer's ``apply_gradients``
  does) and plain SGD ``v.assign_sub(lr * g)`` on every replica's copy;
* ``train_step(iterator)``: a ``tf.function`` (no XLA) returning
  ``strategy.reduce(SUM, strategy.run(replica_step, ...), axis=None)``; the
  loss is fetched with ``.numpy()`` after every step.

This file imports only TensorFlow, numpy and the standard library: it runs in
a separate environment (TensorFlow and ONNX Runtime are not installed side by
side), started by the benchmark as a subprocess::

    .bench-venvs/tf/bin/python benchmarks/tf_mirrored_train.py --data DATA.npz --serve

Inputs (``--data``): an ``.npz`` with ``x``, ``labels``, ``lr``,
``global_batch`` and the initial ``w0, b0, w1, b1, ...``. Without ``--data``
the script makes its own He-initialised 784-512-512-10 MLP and batch of 256.

Modes:

* ``--check OUT.npz``: one step of every variant from the initial weights;
  saves ``<variant>_loss`` and ``<variant>_w0, ...`` (for the mirrored
  variant replica 0's copy, and ``mirrored_replicas_equal``: whether every
  replica's copy is identical).
* ``--serve``: line protocol for interleaved timing. Each stdin line is
  ``run VARIANT CALLS`` (time ``CALLS`` steps back to back) or ``quit``; each
  answer is one JSON line ``{"us_per_call": ...}``. The first line written is
  ``{"ready": true, "tensorflow": VERSION, ...}`` after the warm-up.
* otherwise: ``--rounds`` rounds of ``--calls`` steps per variant, one JSON
  object on stdout.

Threads: ``--intra-op`` (default 2) and ``--inter-op`` (default 2: the two
replicas' ops run side by side on the inter-op pool), process-wide, set before
TensorFlow runs anything.
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

VARIANTS = ("mirrored", "default")
CROSS_DEVICE_OPS = ("default", "reduction_to_one", "hierarchical_copy")






def configure(intra_op, inter_op, replicas=2):
    """Thread pools and the logical CPU devices; must run before TensorFlow initialises its devices."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return tf


def _cross_device_ops(tf, name):
    if name == "default":
        return None
    if name == "reduction_to_one":
        return tf.distribute.ReductionToOneDevice()
    if name == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    raise ValueError(f"unknown cross-device ops {name!r}; choose from {CROSS_DEVICE_OPS}")


class Variant:
    """One strategy's model, distributed dataset iterator and compiled step."""

    def __init__(self, tf, kind, data, cross_device_ops="default", replicas=2):
        if kind == "mirrored":
            devices = [f"/cpu:{i}" for i in range(replicas)]
            self.strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=_cross_device_ops(
                tf, cross_device_ops))
        elif kind == "default":
            self.strategy = tf.distribute.get_strategy()
        else:
            raise ValueError(f"unknown variant {kind!r}; choose from {VARIANTS}")
        self.kind = kind
        strategy = self.strategy
        layers = sum(1 for key in data if key.startswith("w") and key[1:].isdigit())
        with strategy.scope():
            self.variables = []
            for i in range(layers):
                self.variables.append(tf.Variable(data[f"w{i}"], name=f"dense_{i}/kernel"))
                self.variables.append(tf.Variable(data[f"b{i}"], name=f"dense_{i}/bias"))
        variables = self.variables
        lr = tf.constant(float(data["lr"]), tf.float32)
        global_batch = int(data["global_batch"])
        sum_op = tf.distribute.ReduceOp.SUM

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
            grads = tf.distribute.get_replica_context().all_reduce(sum_op, grads)  # one batched all-reduce
            for variable, grad in zip(variables, grads):
                variable.assign_sub(lr * grad)
            return loss

        @tf.function  # jit_compile left at its default (no XLA)
        def train_step(iterator):
            x, labels = next(iterator)
            return strategy.reduce(sum_op, strategy.run(replica_step, args=(x, labels)), axis=None)

        dataset = tf.data.Dataset.from_tensors((data["x"], data["labels"])).repeat().prefetch(2)
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset))
        self._train_step = train_step
        ops = getattr(strategy.extended, "_cross_device_ops", None)
        self.info = {"strategy": type(strategy).__name__,
                     "cross_device_ops": type(ops).__name__ if ops is not None else None,
                     "devices": list(strategy.extended.worker_devices) if kind == "mirrored" else [],
                     "replicas": strategy.num_replicas_in_sync}

    def step(self):
        return self._train_step(self.iterator).numpy()  # .numpy(): the loss on the host every step

    def params(self):
        """Replica 0's copy of every parameter, and whether all replicas' copies are identical."""
        import numpy as np

        first, equal = [], True
        for variable in self.variables:
            copies = [np.asarray(v) for v in self.strategy.experimental_local_results(variable)]
            first.append(copies[0])
            equal = equal and all(np.array_equal(copies[0], c) for c in copies[1:])
        return first, equal




def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="npz with x, labels, lr, global_batch, w0, b0, ... (default: built in)")
    parser.add_argument("--intra-op", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--inter-op", type=int, default=2, help="inter-op threads (default 2)")
    parser.add_argument("--cross-device-ops", choices=CROSS_DEVICE_OPS, default="default",
                        help="MirroredStrategy's all-reduce (default: TensorFlow's own choice)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: mirrored,default")
    parser.add_argument("--check", metavar="OUT", help="one step per variant from the initial weights; save to OUT")
    parser.add_argument("--serve", action="store_true", help="line protocol on stdin/stdout (see the docstring)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per variant first (default 20)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)

    data = load_data(args.data)
    tf = configure(args.intra_op, args.inter_op)
    names = [name for name in args.variants.split(",") if name]
    variants = {name: Variant(tf, name, data, args.cross_device_ops) for name in names}
    if args.check:
        import numpy as np

        out = {}
        for name, variant in variants.items():
            out[f"{name}_loss"] = np.float32(variant.step())
            params, equal = variant.params()
            out[f"{name}_replicas_equal"] = np.bool_(equal)
            for i, value in enumerate(params):
                out[f"{name}_{'wb'[i % 2]}{i // 2}"] = value
        np.savez(args.check, **out)
        losses = {key: float(value) for key, value in out.items() if key.endswith("_loss")}
        print(json.dumps({"tensorflow": tf.__version__, **losses}))
        return 0

    first = {}
    for name, variant in variants.items():
        start = time.perf_counter()
        variant.step()
        first[name] = time.perf_counter() - start  # trace + first run
        for _ in range(args.warmup):
            variant.step()
    info = {"tensorflow": tf.__version__, "intra_op": args.intra_op, "inter_op": args.inter_op,
            "first_call_s": first, "variants": {name: v.info for name, v in variants.items()}}
    if args.serve:
        print(json.dumps({"ready": True, **info}), flush=True)
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "quit":
                break
            if command[0] == "run" and len(command) == 3 and command[1] in variants:
                print(json.dumps({"us_per_call": time_calls(variants[command[1]].step, int(command[2]))}), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
        return 0
    rounds = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            rounds[name].append(time_calls(variant.step, args.calls))
    print(json.dumps({**info, "calls": args.calls, "us_per_call": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
