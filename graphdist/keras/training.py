"""The engine behind ``model.fit``, ``evaluate`` and ``predict``.

A compiled model gets three ``gd.function`` steps, each traced once per input
shape (the full global batch, and the partial last one) into one graph and
one plan:

* train: ``strategy.run`` of the replica step (forward with
  ``training=True``, per-example losses, times their sample weights when
  the batch has them, summed and divided by the *global* batch size,
  ``gd.GradientTape`` gradients, ``optimizer.apply_gradients``, which sums
  them over the replicas) followed by ``strategy.reduce("SUM")`` of the
  replicas' loss and metric sums;
* test: the same without gradients (``training=False``);
* predict: ``strategy.run`` of the forward pass; the replicas' outputs are
  concatenated on the host in replica order (with several workers, gathered
  from every worker), i.e. in input order.

Each global batch is divided among the replicas as evenly as possible
(sizes differ by at most one, replica 0 first, so a partial last batch of
3 on 2 replicas is 2 + 1), through
``strategy.experimental_distribute_values_from_function``, and the batches
are produced and split ahead of the steps in a background thread
(``Dataset.prefetch``). Targets are
checked on the host against the loss (shape, class range) before a batch is
used. Loss and metric sums are accumulated in float64 on the host, so the
epoch's numbers are those of all its examples, partial last batch included.

Sample weights (Keras' ``SUM_OVER_BATCH_SIZE``): a batch's loss is
``sum(w_i * loss_i) / global batch size``, the number of examples, not the
sum of the weights; each replica divides its partial sum by the global
size, so the all-reduced gradient equals one device's. The epoch's ``loss``
log is ``sum(w_i * loss_i) / examples`` (Keras' loss tracker: the batch
losses averaged with the batch sizes as weights). ``weighted_metrics`` get
``sum(w * value) / sum(w)``; plain ``metrics`` ignore the weights, as in
Keras. A batch without weights is a separate (unweighted) trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graphdist import nest
from graphdist.compile.function import function as gd_function
from graphdist.data.dataset import Dataset
from graphdist.distribute.strategy import DefaultStrategy, get_strategy, has_strategy
from graphdist.errors import GraphdistError, InvalidArgumentError
from graphdist.keras import losses as losses_lib
from graphdist.keras import metrics as metrics_lib
from graphdist.keras.progress import Progress
from graphdist.trace.tape import GradientTape
from graphdist.trace.values import DistributedValues

__all__ = ["NotCompiledError", "Engine", "check_strategy", "split_global_batch"]

logger = logging.getLogger(__name__)


class NotCompiledError(GraphdistError, RuntimeError):
    """``fit``/``evaluate`` was called on a model that was not compiled."""


def _is_distributed(value: Any) -> bool:
    return isinstance(value, DistributedValues)


def split_global_batch(strategy: Any, element: Any) -> Any:
    """``element`` (a nest of arrays sharing their first axis) with a per-replica value at every leaf.

    Replica ``i`` gets rows ``[start_i, start_i + size_i)``, the sizes as equal as
    possible and in replica order, so gathering the replicas' outputs restores
    the input order.
    """
    leaves, treedef = nest.flatten(element)
    count = strategy.num_replicas_in_sync
    base, extra = divmod(int(np.shape(leaves[0])[0]), count)
    bounds = [0]
    for replica in range(count):
        bounds.append(bounds[-1] + base + (1 if replica < extra else 0))

    def per_replica(leaf: Any) -> Any:
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: leaf[bounds[ctx.replica_id_in_sync_group]:bounds[ctx.replica_id_in_sync_group + 1]])

    return nest.unflatten(treedef, [per_replica(leaf) for leaf in leaves])


def _distributed(strategy: Any, dataset: Dataset) -> Dataset:
    """``(per-replica element, global batch size)`` for each of ``dataset``'s global batches, split among
    the replicas two batches ahead in a background thread.
    """
    def split_all() -> Iterator[Any]:
        for element in dataset:
            yield split_global_batch(strategy, element), int(np.shape(nest.flatten(element)[0][0])[0])

    return Dataset(split_all, dataset.cardinality(), repr(dataset)).prefetch(2)


def _strategy_name(strategy: Any) -> str:
    return "no strategy (the default strategy)" if isinstance(strategy, DefaultStrategy) else repr(strategy)


def check_strategy(model: Any, what: str, optimizer: Any = None) -> None:
    """Raises when ``what`` is called under another strategy than the model's, or when the
    model's (or the optimizer's: ``optimizer``, else the compiled one) variables belong to another strategy.
    """
    strategy = model.distribute_strategy
    current = get_strategy()
    fix = ("create the model, its optimizer and metrics inside `with strategy.scope():` of the strategy that "
           "trains it (fit, evaluate and predict then enter that scope themselves)")
    if has_strategy() and current is not strategy:
        raise InvalidArgumentError(f"{what}: the model {model.name!r} was created under {_strategy_name(strategy)} but "
                                   f"{what} was called inside the scope of {current!r}; {fix}")
    expected = None if isinstance(strategy, DefaultStrategy) else strategy
    owners = [(v, "model") for v in model.variables]
    optimizer = optimizer if optimizer is not None else model.optimizer
    if optimizer is not None:
        owners += [(v, "optimizer") for v in optimizer.variables()]
    for variable, owner in owners:
        if getattr(variable, "distribute_strategy", None) is not expected:
            other = variable.distribute_strategy or "no strategy (outside any scope)"
            raise InvalidArgumentError(
                f"{what}: the {owner}'s variable {variable.name} was created under {other}, but the model "
                f"{model.name!r} belongs to {_strategy_name(strategy)}; {fix}")


class _Totals:
    """Host-side float64 sums of one epoch (loss and every metric)."""

    def __init__(self, metrics: list[metrics_lib.Metric]) -> None:
        self.metrics = metrics
        for metric in metrics:
            metric.reset_state()
        self.loss = 0.0
        self.samples = 0

    def add(self, reduced: np.ndarray, samples: int) -> None:
        values = reduced.tolist()  # [loss sum, metric 0 total, metric 0 count, ...] summed over replicas
        self.loss += values[0]
        self.samples += samples
        for index, metric in enumerate(self.metrics):
            metric.merge(values[1 + 2 * index], values[2 + 2 * index])

    def logs(self) -> dict[str, float]:
        logs = {"loss": self.loss / self.samples if self.samples else 0.0}
        logs.update({metric.name: float(metric.result()) for metric in self.metrics})
        return logs


class Engine:
    """The compiled steps of one compiled model and the loops that drive them.

    Args:
        model: The model (built or not).
        optimizer: A ``gd.optimizers`` optimizer (``None``: evaluate/predict only).
        loss: A :class:`graphdist.keras.losses.Loss`.
        metrics: :class:`graphdist.keras.metrics.Metric` objects (unweighted).
        weighted_metrics: Metrics that take the batches' sample weights.
    """

    def __init__(self, model: Any, optimizer: Any, loss: Any, metrics: list[metrics_lib.Metric],
                 weighted_metrics: list[metrics_lib.Metric] | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.weighted_metrics = list(weighted_metrics or [])
        self.metrics = [*metrics, *self.weighted_metrics]
        self.strategy = model.distribute_strategy
        self.train_function = gd_function(self._train_step, name=f"{model.name}_train_step")
        self.test_function = gd_function(self._test_step, name=f"{model.name}_test_step")
        self.predict_function = gd_function(self._predict_step, name=f"{model.name}_predict_step")
        self.serving_function = gd_function(self._serving_step, name=f"{model.name}_serving")
        self._seen: set[Any] = set()
        self.train_steps: list[Any] = []  # concrete train steps, in compile order

    # ------------------------------------------------------------------ steps
    def _statistics(self, loss_sum: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        """One vector ``[loss sum, metric 0 total, metric 0 count, ...]``: a single all-reduce per step."""
        dtype = np.float64 if loss_sum.dtype == np.float64 else np.float32
        parts = [loss_sum]
        for metric in self.metrics:
            weighted = sample_weight is not None and any(metric is m for m in self.weighted_metrics)
            parts.extend(metric.batch_totals(y, y_pred, sample_weight=sample_weight) if weighted
                         else metric.batch_totals(y, y_pred))
        return np.stack([np.reshape(p.astype(dtype), ()) for p in parts])

    def _loss_sum(self, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        """The replica's sum of per-example losses, each times its sample weight when there are weights."""
        per_example = self.loss.per_example(y, y_pred)
        if sample_weight is not None:
            per_example = per_example * losses_lib.weigh_like(sample_weight, per_example)
        return np.sum(per_example)

    def _replica_train(self, x: Any, y: Any, sample_weight: Any, global_batch: int) -> Any:
        model = self.model
        variables = model.trainable_variables
        with GradientTape() as tape:
            y_pred = model(x, training=True)
            loss_sum = self._loss_sum(y, y_pred, sample_weight)
            # The seeds' loss scaling: sum / global batch, so replicas' summed gradients are the global mean's
            # (with sample weights too: Keras' SUM_OVER_BATCH_SIZE divides by examples, not by the weights' sum).
            loss = loss_sum / np.asarray(global_batch, dtype=loss_sum.dtype)
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        return self._statistics(loss_sum, y, y_pred, sample_weight)

    def _replica_test(self, x: Any, y: Any, sample_weight: Any) -> Any:
        y_pred = self.model(x, training=False)
        return self._statistics(self._loss_sum(y, y_pred, sample_weight), y, y_pred, sample_weight)

    def _train_step(self, x: Any, y: Any, sample_weight: Any, batch: int) -> Any:
        per_replica = self.strategy.run(self._replica_train, args=(x, y, sample_weight, batch))
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def _test_step(self, x: Any, y: Any, sample_weight: Any) -> Any:
        per_replica = self.strategy.run(self._replica_test, args=(x, y, sample_weight))
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def _predict_step(self, x: Any) -> Any:
        return self.strategy.run(self._forward, args=(x,))

    def _serving_step(self, x: Any) -> Any:
        """The forward pass with the replicas' outputs gathered in the plan (for exported plans)."""
        leaves, treedef = nest.flatten(self._predict_step(x), is_leaf=_is_distributed)
        return nest.unflatten(treedef, [self.strategy.gather(leaf, axis=0) for leaf in leaves])

    def _forward(self, x: Any) -> Any:
        return self.model(x, training=False)

    # ------------------------------------------------------------------ loops
    def _checked_batches(self, dataset: Dataset, what: str, with_targets: bool) -> Dataset:
        """``dataset`` with every batch's targets validated (in the prefetch thread)."""
        output_shape = self.model._output_shape
        loss = self.loss

        def batches() -> Iterator[Any]:
            for index, element in enumerate(dataset):
                if with_targets:
                    for leaf in nest.flatten(element[1])[0]:
                        loss.check_targets(np.asarray(leaf), output_shape, f"{what}: batch {index}")
                    _check_same_batch(element, what, index)
                yield element

        return Dataset(batches, dataset.cardinality(), repr(dataset), batch_size=dataset._batch_size)

    def _call(self, function: Any, args: tuple, progress: Progress, what: str) -> Any:
        """Calls a step, showing compilation progress the first time a batch shape is seen."""
        leaves, _ = nest.flatten(args, is_leaf=_is_distributed)
        key = (id(function), tuple(_shape_key(leaf) for leaf in leaves))
        if key in self._seen:
            return function(*args)
        with progress.compiling(what):
            result = function(*args)
        self._seen.add(key)
        if function is self.train_function:
            self.train_steps.append(function.get_concrete_function(*args))  # cached: no new trace
        return result

    def run_epoch(self, dataset: Dataset, train: bool, progress: Progress, label: str, steps: int | None,
                  on_batch_end: Callable[[int, dict[str, float]], None] | None = None,
                  after: Callable[[dict[str, float]], dict[str, float]] | None = None) -> dict[str, float]:
        """One pass of the train or test step over ``dataset``; returns the epoch's logs
        (passed through ``after``, e.g. to add validation logs, before they are shown).
        """
        what = "fit" if train else "evaluate"
        function = self.train_function if train else self.test_function
        totals = _Totals(self.metrics)
        distributed = _distributed(self.strategy, self._checked_batches(dataset, what, True))
        progress.begin(label, steps)
        count = 0
        with self.model._scope():
            for count, ((x, y, sample_weight), batch) in enumerate(distributed, start=1):
                args = (x, y, sample_weight, batch) if train else (x, y, sample_weight)
                reduced = self._call(function, args, progress, f"the {'train' if train else 'test'} step")
                totals.add(reduced, batch)
                logs = totals.logs()
                progress.update(count, totals.samples, logs)
                if on_batch_end is not None:
                    on_batch_end(count - 1, logs)
                if train and getattr(self.model, "stop_training", False):
                    break  # a callback stopped training after this batch (TerminateOnNaN), as in Keras
        if count == 0:
            raise InvalidArgumentError(f"{what}: the input has no batches; give at least one example")
        logs = totals.logs()
        if after is not None:
            logs = after(logs)
        progress.end(count, totals.samples, logs)
        return logs

    def predict(self, dataset: Dataset, progress: Progress, steps: int | None) -> Any:
        """Outputs for every example, in input order (the gathered replicas' outputs, batch by batch)."""
        distributed = _distributed(self.strategy, dataset)
        outputs: list[Any] = []
        progress.begin("", steps)
        samples = 0
        with self.model._scope():
            for count, (x, batch) in enumerate(distributed, start=1):
                per_replica = self._call(self.predict_function, (x,), progress, "the predict step")
                leaves, treedef = nest.flatten(per_replica, is_leaf=_is_distributed)
                outputs.append(nest.unflatten(treedef, [self._rows_in_order(leaf, batch) for leaf in leaves]))
                samples += batch
                progress.update(count, samples, {})
        if not outputs:
            raise InvalidArgumentError("predict: the input has no batches; give at least one example")
        progress.end(len(outputs), samples, {})
        return nest.map_structure(lambda *parts: np.concatenate([np.asarray(p) for p in parts], axis=0), *outputs)

    def _rows_in_order(self, value: Any, batch: int) -> np.ndarray:
        """One global batch's outputs in input order: local replicas concatenated, then (with several
        workers) every worker's rows gathered in worker order.
        """
        local = np.concatenate([np.asarray(v) for v in self.strategy.experimental_local_results(value)], axis=0)
        communicator = getattr(self.strategy, "communicator", None)
        hook = getattr(self.strategy, "_input_workers", None)
        workers = hook()[0] if callable(hook) else 1
        if communicator is None or workers == 1:
            return local
        replicas = self.strategy.num_replicas_in_sync
        base, extra = divmod(batch, replicas)
        per_worker = replicas // workers
        sizes = [sum(base + (1 if r < extra else 0) for r in range(w * per_worker, (w + 1) * per_worker))
                 for w in range(workers)]
        padded = np.zeros((max(sizes), *local.shape[1:]), local.dtype)
        padded[:len(local)] = local
        gathered = communicator.all_gather(padded, 0, name="predict outputs").reshape(workers, *padded.shape)
        return np.concatenate([gathered[w, :size] for w, size in enumerate(sizes)], axis=0)

    def train_concrete_function(self) -> Any:
        """The concrete train step of the most common (full) batch shape compiled so far."""
        if not self.train_steps:
            raise InvalidArgumentError("no train step has been compiled yet; call fit first")
        return self.train_steps[0]


def _shape_key(leaf: Any) -> Any:
    """What decides a new trace: the replicas' shapes, or a Python constant's value."""
    if isinstance(leaf, int):
        return leaf
    if _is_distributed(leaf):
        return tuple(tuple(np.shape(v)) for v in leaf.values)
    return tuple(np.shape(leaf))


def _check_same_batch(element: Any, what: str, index: int) -> None:
    sizes = {int(np.shape(leaf)[0]) for leaf in nest.flatten(element)[0] if np.ndim(leaf)}
    if len(sizes) > 1:
        raise InvalidArgumentError(f"{what}: batch {index} has x and y of different lengths {sorted(sizes)}; each "
                                   "(x, y) batch needs one target row per example")
