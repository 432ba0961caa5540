"""AccumulateGradientsPass: each replica computes its step on ``k`` micro-batches, one update per step.

Gradient accumulation (``gd.function(step, accumulate_steps=k)``): every
replica's batch of ``B`` rows is cut into ``k`` micro-batches of ``B / k``
rows; the forward and backward computation runs once per micro-batch, and
what crosses replicas (the gradient aggregation of ``apply_gradients``,
``all_reduce``, ``strategy.reduce``...) combines the micro-batches first.
The micro-batches act as more replicas of the same device: summed over
micro-batches and replicas, the gradients are those of the whole global
batch, so one step with ``accumulate_steps=k`` makes the update of one step
on the ``k``-times larger batch, provided the loss is scaled by the global
batch as in any distributed step (``gd.nn.compute_average_loss``: its
replica count counts the micro-batches too).

The pass runs on the traced graph, before ``AutodiffPass`` (each
micro-batch's ``Gradient`` node is then differentiated for micro-batch
shapes) and ``ReplicatePass``. The *micro region* is every node that depends on a batch
input (``graph.meta.per_replica_inputs``) or on a constant computed from the
batch size, without passing through a cross-replica op (``ReplicaAllReduce``, ``ReplicaAllGather``,
``CrossReplicaReduce``, ``CrossReplicaGather``).

Invariant established: every micro-region node exists once per micro-batch
``m`` (``meta["micro"] = m``), reading the rows ``[m * B/k, (m + 1) * B/k)``
of each batch input (a ``Slice``) and micro-batch ``m``'s copies of the other
micro-region values; every other reader of a micro-region value reads the
micro-batches' values combined; ``graph.meta.accumulate_steps = k``. The
graph's inputs, outputs and their shapes are unchanged.

Cases:

* ``ReplicaAllReduce`` of a micro-region value: the micro-batches' values
  added first (``SUM``, ``MEAN``: extensive values, like a loss scaled by the
  global batch), or their ``Max`` / ``Min`` (``MAX``, ``MIN``);
* ``ReplicaAllGather`` / ``CrossReplicaGather``: concatenated along the
  gathered axis first; ``CrossReplicaReduce`` with an ``axis``: concatenated
  along axis 0; without one: as ``ReplicaAllReduce``;
* any other reader (a graph output, an update reading the loss): values with
  the batch as first dimension (it shrank to ``B / k`` in the micro-batches)
  are concatenated along it; values whose shape does not depend on the batch
  are added (``Add``; booleans cannot be and are a ``GraphError``);
* ``NumReplicas``: times ``k`` wherever it is read (the micro-batches count
  as replicas, so ``compute_average_loss`` divides by the global batch);
* constants computed from the batch size (``value.meta["batch"]``): a copy for
  ``B / k`` read by the micro-batches;
* a variable assigned from a micro-region value (moving statistics of
  ``BatchNormalization``), or a micro-region node reading a value computed
  from the batch after a cross-replica op (synchronized batch
  normalization): ``NotImplementedError`` naming the node;
* ``k == 1`` or already accumulated (also a second run): unchanged;
* no batch inputs, uneven per-replica shapes, or a batch not divisible by
  ``k``: ``GraphError`` saying what to change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.batch import BatchDim, elements, evaluate
from graphdist.ir.graph import GRAPHDIST_DOMAIN, Graph, Node, Value
from graphdist.ir.ops import node_opdef
from graphdist.passes.base import PassBase, PassContext, PassResult

__all__ = ["AccumulateGradientsPass"]

#: Cross-replica ops: the micro region ends at them, and they read the micro-batches combined.
_BOUNDARY = frozenset({"ReplicaAllReduce", "ReplicaAllGather", "CrossReplicaReduce", "CrossReplicaGather"})
#: How an all-reduce's ``reduce_op`` combines micro-batches before it.
_COMBINE = {"SUM": "Add", "MEAN": "Add", "MAX": "Max", "MIN": "Min"}


class AccumulateGradientsPass(PassBase):
    """Runs each replica's computation on ``steps`` micro-batches of its batch (see the module docstring).

    Args:
        steps: Micro-batches per replica and step (``accumulate_steps``).
    """

    def __init__(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise GraphError(f"AccumulateGradientsPass needs a positive number of micro-batches, got {steps!r}")
        self.steps = int(steps)

    def __repr__(self) -> str:
        return f"{self.name}(steps={self.steps})"

    def call(self, graph: Graph, ctx: PassContext) -> PassResult:
        if self.steps == 1 or graph.meta.accumulate_steps is not None:
            return PassResult(graph, modified=False)
        MicroBatchRewriter(graph, self.steps).run()
        graph.meta.accumulate_steps = self.steps
        return PassResult(graph, modified=True)


class MicroBatchRewriter:
    """One run of :class:`AccumulateGradientsPass` over one graph.

    Args:
        graph: The traced graph, rewritten in place by :meth:`run`.
        steps: Micro-batches per replica.
        tree: Combine the micro-batches' sums in a fixed pairwise tree, ``((m0 + m1) + (m2 + m3)) + ...``,
            instead of a running total (``SplitBatchChunksPass``: the tree of one replica's chunks is then a
            subtree of the tree over the whole global batch).
        label: How messages name the option that asked for micro-batches.
    """

    def __init__(self, graph: Graph, steps: int, tree: bool = False, label: str = "accumulate_steps") -> None:
        self.graph = graph
        self.k = steps
        self.tree = tree
        self.label = label
        self.batch = self._batch_size()
        self.micro = self.batch // steps
        per_replica = graph.meta.per_replica_inputs
        self.batch_inputs = [v for v in graph.inputs if v.name in per_replica]
        self.region = self._micro_region()
        self.after_boundary = self._after_boundary()
        # copies[id(value)][m]: micro-batch m's copy of a micro-region value (or batch input slice)
        self.copies: dict[int, list[Value]] = {}
        self.derived: dict[tuple[int, Any], Value] = {}  # (id(value), key) -> a value made from it, made once
        # tree mode: (id(value), key) -> the pending subtree sums, (level, value), levels strictly decreasing
        self.pending: dict[tuple[int, Any], list[tuple[int, Value]]] = {}
        self.nodes: list[Node] = []

    # ------------------------------------------------------------ analysis
    def _batch_size(self) -> int:
        graph = self.graph
        if graph.meta.replica_variants:
            raise GraphError(f"graph {graph.name!r} was traced with per-replica batches of different sizes (a "
                             "partial last batch); accumulate_steps needs every replica's batch to have one size "
                             "divisible by it: batch the dataset with drop_remainder=True")
        batch = graph.meta.batch
        if batch is None:
            raise GraphError(f"graph {graph.name!r} has no batch input to cut into micro-batches; accumulate_steps "
                             "splits the per-replica arguments of the step (with one replica per process: its array "
                             "arguments) along their first dimension")
        if int(batch) % self.k:
            raise GraphError(f"{self.label}={self.k} cannot cut a per-replica batch of {int(batch)} rows into "
                             f"equal micro-batches; use a batch divisible by {self.k} (drop_remainder=True for a "
                             "dataset's last batch) or another accumulate_steps")
        return int(batch)

    def _sources(self) -> set[int]:
        """The ids of the batch inputs and of the constants computed from the batch size."""
        constants = [v for v in self.graph.initializers.values() if elements(v.meta.get("batch"))]
        return {id(v) for v in [*self.batch_inputs, *constants]}

    def _micro_region(self) -> set[int]:
        """The ids of the nodes that depend on a batch input or size without passing a cross-replica op."""
        tainted = self._sources()
        region: set[int] = set()
        for node in self.graph.nodes:
            if _is_boundary(node) or not any(v is not None and id(v) in tainted for v in node.inputs):
                continue
            region.add(id(node))
            tainted.update(id(out) for out in node.outputs)
        return region

    def _after_boundary(self) -> set[int]:
        """The ids of the values computed from a batch input or size through a cross-replica op."""
        tainted = self._sources()
        late: set[int] = set()
        for node in self.graph.nodes:
            reads = [id(v) for v in node.inputs if v is not None]
            if _is_boundary(node) and any(r in tainted for r in reads) or any(r in late for r in reads):
                late.update(id(out) for out in node.outputs)
            if any(r in tainted for r in reads):
                tainted.update(id(out) for out in node.outputs)
        return late

    # ------------------------------------------------------------ rewrite
    def run(self) -> None:
        region = [n for n in self.graph.nodes if id(n) in self.region]
        for node in region:
            self._refuse_unsupported(node)
        before, after = self._split_rest()
        for node in before:
            self.nodes.append(node)
            if node.domain == GRAPHDIST_DOMAIN and node.op_type == "NumReplicas":
                self._count_micro_batches(node.outputs[0])
        # One micro-batch after the other, so that a backend running the nodes in order can free each
        # micro-batch's activations before the next one starts.
        running: list[tuple[Value, str]] = []
        for m in range(self.k):
            for node in region:
                copy = self._copy(node, m)  # appends the Slices of the batch inputs it reads first
                self.nodes.append(copy)
            if m == 0:
                running = self._running_combinations(after)
            else:
                self._advance(running, m)
        self._finish(running)
        for node in after:
            self._read_combined(node)
            self.nodes.append(node)
        self.graph.outputs = [self._merged(v, None) if id(v) in self.copies else v for v in self.graph.outputs]
        self.graph.set_nodes(self.nodes)  # the region's nodes, left out, leave the graph

    def _split_rest(self) -> tuple[list[Node], list[Node]]:
        """The nodes outside the micro region: those that do not depend on it (they run first) and those
        that do (cross-replica ops and what follows them: they run after every micro-batch).
        """
        later = set(self.region)
        before, after = [], []
        for node in self.graph.nodes:
            if id(node) in self.region:
                continue
            if any(v is not None and v.producer is not None and id(v.producer) in later for v in node.inputs):
                later.add(id(node))
                after.append(node)
            else:
                before.append(node)
        return before, after

    def _refuse_unsupported(self, node: Node) -> None:
        if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AssignVariable":
            raise NotImplementedError(
                f"{self.label}: node {node.name} assigns a variable from each micro-batch's values (moving "
                "statistics such as BatchNormalization's); a step that updates state from the batch itself cannot "
                "be accumulated yet: drop accumulate_steps, or keep such layers out of the step")
        late = [v.name for v in node.inputs if v is not None and id(v) in self.after_boundary]
        if late:
            raise NotImplementedError(
                f"{self.label}: node {node.name} ({node.qualified_op}) computes on the batch after a "
                f"cross-replica reduction of it (%{late[0]}: synchronized batch normalization, or an all_reduce "
                "whose result meets the batch again); such a step cannot be cut into micro-batches yet")

    def _copy(self, node: Node, m: int) -> Node:
        return self._twin(node, m, node.op_type, [self._micro_input(v, m) for v in node.inputs], dict(node.attrs))

    def _twin(self, node: Node, m: int, op_type: str, inputs: list[Value | None], attrs: dict[str, Any]) -> Node:
        """Micro-batch ``m``'s copy of ``node``, computed by ``op_type(inputs)`` (its outputs are ``node``'s)."""
        twin = Node(op_type, inputs, attrs, domain=node.domain if op_type == node.op_type else "")
        twin.name = self.graph.unique_name(f"{node.name}_m{m}", node=True)
        twin.device, twin.replica = node.device, node.replica
        twin.meta = {**node.meta, "micro": m}
        try:
            types = node_opdef(twin, self.graph).infer(twin, len(node.outputs))
        except GraphError as err:
            source = node.meta.get("source")
            raise GraphError(f"{self.label}: node {node.name} ({node.qualified_op}"
                             f"{', traced at ' + source if source else ''}) does not accept micro-batches of "
                             f"{self.micro} rows: {err}") from None
        for out, (dtype, shape) in zip(node.outputs, types):
            value = Value(self.graph.unique_name(f"{out.name}_m{m}"), dtype, shape, producer=twin, index=out.index)
            value.meta = dict(out.meta)
            twin.outputs.append(value)
            self.copies.setdefault(id(out), []).append(value)
        return twin

    def _micro_input(self, value: Value | None, m: int) -> Value | None:
        if value is None:
            return None
        if id(value) in self.copies:
            return self.copies[id(value)][m]
        if value in self.batch_inputs:
            return self._slice(value, m)
        if value.const_value is not None and elements(value.meta.get("batch")):
            return self._once(value, "micro", lambda: self._micro_constant(value))
        return value

    def _count_micro_batches(self, count: Value) -> None:
        """Every reader of the replica count reads it times ``k``: the micro-batches count as replicas."""
        readers = [reader for reader, _ in count.uses]
        scaled = self._add("Mul", [count, self._constant("micro_batches", np.array(self.k, count.dtype))],
                           count.producer.meta)
        for reader in readers:
            for index, value in enumerate(reader.inputs):
                if value is count:
                    reader.replace_input(index, scaled)
        if count in self.graph.outputs:
            self.graph.outputs = [scaled if v is count else v for v in self.graph.outputs]

    def _slice(self, value: Value, m: int) -> Value:
        def make() -> Value:
            start, stop = m * self.micro, (m + 1) * self.micro
            rows = self._add("Slice", [value, self._constant("micro_start", np.array([start], np.int64)),
                                       self._constant("micro_stop", np.array([stop], np.int64)),
                                       self._constant("micro_axis", np.array([0], np.int64))],
                             {"context": "replica"} if self._read_in_replicas(value) else {})
            rows.shape = (BatchDim(self.micro), *rows.shape[1:])
            return rows
        return self._once(value, ("slice", m), make)

    def _read_in_replicas(self, value: Value) -> bool:
        return any(reader.meta.get("context") == "replica" for reader, _ in value.uses)

    def _micro_constant(self, value: Value) -> Value:
        array = evaluate(np.asarray(value.const_value), elements(value.meta["batch"]), self.micro)
        return self.graph.add_initializer(f"{value.name}_micro", array)

    # ------------------------------------------------------------ combining
    def _read_combined(self, node: Node) -> None:
        for index, value in enumerate(list(node.inputs)):
            if value is None or id(value) not in self.copies:
                continue
            if node.domain == GRAPHDIST_DOMAIN and node.op_type == "AssignVariable":
                self._refuse_unsupported(node)
            node.replace_input(index, self._merged(value, node))

    def _merge_kind(self, value: Value, reader: Node | None) -> tuple[str, int]:
        """How ``reader`` reads the micro-batches of ``value``: ``("Concat", axis)``, or ``("Add" | "Max" |
        "Min", 0)`` (see the module docstring).
        """
        copies = self.copies[id(value)]
        attrs = reader.attrs if reader is not None and reader.domain == GRAPHDIST_DOMAIN else {}
        op = reader.op_type if reader is not None and _is_boundary(reader) else None
        if op in ("ReplicaAllGather", "CrossReplicaGather"):
            return "Concat", int(attrs.get("axis", 0))
        if op == "CrossReplicaReduce" and attrs.get("axis") is not None:
            return "Concat", 0
        if op in ("ReplicaAllReduce", "CrossReplicaReduce"):
            combine = _COMBINE.get(str(attrs.get("reduce_op", "SUM")).upper(), "Add")
            if combine != "Add":
                return combine, 0
        if value.shape and copies[0].shape and copies[0].shape[0] != value.shape[0]:
            return "Concat", 0
        if copies[0].shape != value.shape:
            raise GraphError(f"{self.label}: %{value.name} has shape {value.shape} for the whole batch and "
                             f"{copies[0].shape} per micro-batch, not the batch as its first dimension; its "
                             "micro-batch values cannot be put together")
        if value.dtype == np.bool_:
            raise GraphError(f"{self.label}: %{value.name} is a boolean computed on each micro-batch; "
                             "booleans cannot be added over micro-batches (return or reduce a number instead)")
        return "Add", 0

    def _merged(self, value: Value, reader: Node | None) -> Value:
        """The micro-batches' copies of ``value`` combined for ``reader``."""
        kind, axis = self._merge_kind(value, reader)
        copies = self.copies[id(value)]
        if kind == "Concat":
            return self._once(value, (kind, axis), lambda: self._add("Concat", list(copies), copies[0].producer.meta,
                                                                     {"axis": axis}))
        return self._once(value, (kind, 0), lambda: self._chain(kind, copies))

    def _running_combinations(self, after: list[Node]) -> list[tuple[Value, str]]:
        """The (value, Add | Max | Min) combinations read after the micro-batches: kept as running totals, one
        step after each micro-batch, so each micro-batch's values can be freed before the next one runs.
        """
        wanted: dict[tuple[int, str], tuple[Value, str]] = {}
        reads = [(v, node) for node in after for v in node.inputs if v is not None and id(v) in self.copies]
        reads += [(v, None) for v in self.graph.outputs if id(v) in self.copies]
        for value, reader in reads:
            if reader is not None and reader.domain == GRAPHDIST_DOMAIN and reader.op_type == "AssignVariable":
                continue  # refused when the update is rewired
            kind, _ = self._merge_kind(value, reader)
            if kind != "Concat":
                wanted[(id(value), kind)] = (value, kind)
        return list(wanted.values())

    def _advance(self, running: list[tuple[Value, str]], m: int) -> None:
        """Folds micro-batch ``m`` into the running combinations."""
        for value, kind in running:
            copies = self.copies[id(value)]
            slot = (id(value), (kind, 0))
            if self.tree:
                self._push(slot, kind, copies, m)
                continue
            total = self.derived.get(slot, copies[0])
            self.derived[slot] = self._add(kind, [total, copies[m]], copies[0].producer.meta)

    def _push(self, slot: tuple[int, Any], kind: str, copies: list[Value], m: int) -> None:
        """Tree mode: micro-batch ``m`` joins the pending subtrees; two of one level make one of the next (a
        binary counter), so the sums form the pairwise tree while only about log2(k) partial sums stay alive.
        """
        stack = self.pending.setdefault(slot, [(0, copies[0])])
        stack.append((0, copies[m]))
        while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
            (level, right), (_, left) = stack.pop(), stack.pop()
            stack.append((level + 1, self._add(kind, [left, right], copies[0].producer.meta)))

    def _finish(self, running: list[tuple[Value, str]]) -> None:
        """Tree mode: the pending subtrees joined right to left (one subtree when ``k`` is a power of two)."""
        if not self.tree:
            return
        for value, kind in running:
            slot = (id(value), (kind, 0))
            stack = self.pending.pop(slot, None)
            if not stack:
                continue
            meta = self.copies[id(value)][0].producer.meta
            total = stack.pop()[1]
            while stack:
                total = self._add(kind, [stack.pop()[1], total], meta)
            self.derived[slot] = total

    def _chain(self, op: str, copies: list[Value]) -> Value:
        if self.tree:
            return _pairwise(copies, lambda left, right: self._add(op, [left, right], copies[0].producer.meta))
        total = copies[0]
        for other in copies[1:]:
            total = self._add(op, [total, other], copies[0].producer.meta)
        return total

    # ------------------------------------------------------------ helpers
    def _add(self, op: str, inputs: list[Value], meta: dict[str, Any], attrs: dict[str, Any] | None = None) -> Value:
        node = Node(op, inputs, attrs or {})
        node.name = self.graph.unique_name(f"micro_{op.lower()}", node=True)
        node.meta = {k: v for k, v in meta.items() if k in ("context", "variant", "source")}
        (dtype, shape), = node_opdef(node, self.graph).infer(node, 1)
        out = Value(self.graph.unique_name(node.name), dtype, shape, producer=node)
        node.outputs.append(out)
        self.nodes.append(node)
        return out

    def _constant(self, hint: str, array: np.ndarray) -> Value:
        key = (hint, array.dtype.str, array.tobytes())
        return self._once(key, "constant", lambda: self.graph.add_initializer(hint, array))

    def _once(self, value: Any, key: Any, make: Any) -> Value:
        slot = (id(value) if isinstance(value, Value) else hash(value), key)
        made = self.derived.get(slot)
        if made is None:
            made = self.derived[slot] = make()
        return made


def _pairwise(items: list[Any], combine: Any) -> Any:
    """``combine`` over ``items`` in the pairwise tree of the binary counter (:meth:`MicroBatchRewriter._push`):
    whole power-of-two subtrees from the left, the leftovers joined right to left.
    """
    stack: list[tuple[int, Any]] = []
    for item in items:
        stack.append((0, item))
        while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
            (level, right), (_, left) = stack.pop(), stack.pop()
            stack.append((level + 1, combine(left, right)))
    total = stack.pop()[1]
    while stack:
        total = combine(stack.pop()[1], total)
    return total


def _is_boundary(node: Node) -> bool:
    return node.domain == GRAPHDIST_DOMAIN and node.op_type in _BOUNDARY
