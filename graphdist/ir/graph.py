"""The graphdist IR: :class:`Value`, :class:`Node` and :class:`Graph`.

Modelled on torch.fx and onnx-ir. A :class:`Value` is an SSA edge with a dtype
and a shape; it has at most one producer and records every use. A
:class:`Node` is one op application (ONNX op or ``graphdist``-domain op) that
owns its output values. A :class:`Graph` holds nodes in a valid topological
order, its inputs, outputs and initializers (constant values).

Rewiring always goes through :meth:`Graph.replace_all_uses_with` (or
:meth:`Node.replace_input`) so that use lists stay consistent. The graph owns
its edits: nodes join and leave it only through :meth:`Graph.add_node`,
:meth:`Graph.insert_before` / :meth:`Graph.insert_after` (or the cursor
:meth:`Graph.inserting_before`), :meth:`Graph.remove`,
:meth:`Graph.replace_node` and :meth:`Graph.set_nodes`; ``node.graph`` and
``value.producer`` are read-only properties outside :mod:`graphdist.ir`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from graphdist.errors import GraphError
from graphdist.ir.graph_meta import GraphMeta
from graphdist.ir.op_registry import GRAPHDIST_DOMAIN, ONNX_DOMAIN, OPSET, get_opdef

__all__ = ["Value", "Node", "Graph", "Uses", "Dim", "Shape", "ONNX_DOMAIN", "GRAPHDIST_DOMAIN", "register_view"]


#: A dimension is a static size or a symbolic name (e.g. ``"batch"``).
Dim = int | str
Shape = tuple[Dim, ...]


class Uses(dict):
    """The ``(node, input_index)`` pairs that read a value, in the order they were added.

    A list in every way the IR uses one (``append``, ``remove``, iteration,
    ``len``, ``in``, equality with a list of pairs), held in an
    insertion-ordered dict so that adding, removing and testing a use cost
    O(1) whatever the value's fan-out: verification and rewiring stay linear
    in the size of the graph when one value (a model's input, a shared weight)
    is read by thousands of nodes.
    """

    __slots__ = ()

    def append(self, use: tuple[Node, int]) -> None:
        """Adds ``use`` (last)."""
        self[use] = None

    def remove(self, use: tuple[Node, int]) -> None:
        """Removes ``use``.

        Raises:
            ValueError: ``use`` is not a use of this value (as ``list.remove``).
        """
        try:
            del self[use]
        except KeyError:
            raise ValueError(f"{use!r} is not a use of this value") from None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class Value:
    """An SSA value: produced by one node (or a graph input/initializer).

    Attributes:
        name: Unique name inside its graph.
        dtype: numpy dtype of the elements.
        shape: Tuple of static ints or symbolic dimension names.
        producer: The node that computes it, or ``None`` for graph inputs and
            initializers.
        index: Output position in ``producer.outputs``.
        const_value: The array of an initializer, else ``None``.
        uses: ``(node, input_index)`` pairs that read this value (a :class:`Uses`:
            list-like, with O(1) membership and removal).
    """

    __slots__ = ("name", "dtype", "shape", "_producer", "index", "const_value", "uses", "meta")

    def __init__(
        self,
        name: str,
        dtype: Any,
        shape: Sequence[Dim],
        producer: Node | None = None,
        index: int = 0,
        const_value: np.ndarray | None = None,
    ) -> None:
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape: Shape = tuple(shape)
        self._producer = producer
        self.index = index
        self.const_value = const_value
        self.uses: Uses = Uses()
        self.meta: dict[str, Any] = {}

    @property
    def producer(self) -> Node | None:
        """The node that computes this value (read-only: :meth:`Node.add_output` moves a value)."""
        return self._producer

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known integer."""
        return all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int | None:
        """Size in bytes, or ``None`` when a dimension is symbolic."""
        if not self.is_static:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def type_str(self) -> str:
        """Short type string such as ``float32[256,784]``."""
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type_str()}"


class Node:
    """One op application.

    Attributes:
        op_type: ONNX op type (``"MatMul"``) or graphdist op (``"AllReduce"``).
        domain: ``""`` for ONNX ops, ``"graphdist"`` for graphdist ops.
        inputs: Input values; ``None`` marks an omitted optional input.
        attrs: Attributes with Python values (ints, floats, strings, lists,
            numpy arrays).
        outputs: Values this node produces (owned by it).
        device: Placement such as ``"cpu:0"`` once assigned, else ``None``.
        replica: Replica index once replicated, else ``None``.
        meta: Free-form annotations for passes (source location, region...).
    """

    __slots__ = ("name", "op_type", "domain", "inputs", "attrs", "outputs", "device", "replica", "meta", "_graph")

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = ONNX_DOMAIN,
        name: str = "",
    ) -> None:
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.outputs: list[Value] = []
        self.device: str | None = None
        self.replica: int | None = None
        self.meta: dict[str, Any] = {}
        self._graph: Graph | None = None
        self.inputs: list[Value | None] = list(inputs)
        for index, value in enumerate(self.inputs):  # _append_input, inlined: graphs of 100k nodes are copied often
            if value is not None:
                value.uses[(self, index)] = None

    @property
    def graph(self) -> Graph | None:
        """The graph holding this node, or ``None`` (read-only: the :class:`Graph` edit methods set it)."""
        return self._graph

    @property
    def qualified_op(self) -> str:
        """``op_type`` prefixed by its domain when not ONNX (``graphdist.AllReduce``)."""
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type

    def _append_input(self, value: Value | None) -> None:
        index = len(self.inputs)
        self.inputs.append(value)
        if value is not None:
            value.uses[(self, index)] = None

    def add_output(self, value: Value) -> None:
        """Makes ``value`` this node's next output (its producer and index follow).

        A pass that replaces a node by another hands the old node's output
        values over with it, so their readers need no rewiring.
        """
        old = value._producer
        if old is not None and old is not self and any(out is value for out in old.outputs):
            old.outputs = [out for out in old.outputs if out is not value]
        value._producer, value.index = self, len(self.outputs)
        self.outputs.append(value)

    def replace_input(self, index: int, new: Value | None) -> None:
        """Points input ``index`` at ``new``, keeping use lists consistent."""
        old = self.inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        self.inputs[index] = new
        if new is not None:
            new.uses.append((self, index))

    def detach_inputs(self) -> None:
        """Removes this node from the use lists of all its inputs."""
        for index, value in enumerate(self.inputs):
            if value is not None:
                value.uses.remove((self, index))
        self.inputs = []

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join("None" if v is None else f"%{v.name}" for v in self.inputs)
        return f"{outs} = {self.qualified_op}({ins})"


class Graph:
    """A dataflow graph of :class:`Node` objects in topological order.

    Attributes:
        name: Graph name (becomes the ONNX graph name).
        inputs: Graph inputs (fed at run time).
        outputs: Graph outputs.
        initializers: Constant values by name.
        nodes: Nodes in a valid topological order.
        stage: Pipeline stage the graph is in (``"traced"``, ``"rewritten"``,
            ``"partitioned"``), checked by :func:`graphdist.ir.verify`.
        opset_imports: Opset version per ONNX domain (``""`` is the default
            domain): the forms of the ops in the graph. Traced graphs use
            :data:`graphdist.ir.ops.OPSET`; an imported model keeps its own.
        meta: Graph-level metadata (:class:`~graphdist.ir.graph_meta.GraphMeta`: variables, placement,
            variable updates, replication, batch...).
    """

    _cursor: tuple[Node, bool, int] | None = None  # where add_node inserts: (anchor, after, its last known position)

    def __init__(self, name: str = "graph", stage: str = "traced", *,
                 opset_imports: dict[str, int] | None = None) -> None:
        self.name = name
        self.stage = stage
        self.opset_imports: dict[str, int] = dict(opset_imports or {ONNX_DOMAIN: OPSET})
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.meta = GraphMeta()
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        self._next_suffix = 0  # copied with the graph, so a copy names new nodes as the original would

    @property
    def opset(self) -> int:
        """The default-domain (``ai.onnx``) opset version of the graph."""
        return self.opset_imports.get(ONNX_DOMAIN, OPSET)

    # ------------------------------------------------------------------ names
    def unique_name(self, hint: str, *, node: bool = False) -> str:
        """Returns ``hint`` or ``hint_<n>``, unused in this graph so far.

        Node names and value names are separate namespaces (as in ONNX).
        """
        taken = self._node_names if node else self._names
        hint = hint or "v"
        name = hint
        while name in taken:
            name = f"{hint}_{self._next_suffix}"
            self._next_suffix += 1
        taken.add(name)
        return name

    # ---------------------------------------------------------- construction
    def add_input(self, name: str, dtype: Any, shape: Sequence[Dim]) -> Value:
        """Adds a graph input and returns its value."""
        value = Value(self.unique_name(name), dtype, shape)
        self.inputs.append(value)
        return value

    def add_initializer(self, name: str, array: np.ndarray) -> Value:
        """Adds a constant value and returns it."""
        array = np.asarray(array)
        value = Value(self.unique_name(name), array.dtype, array.shape, const_value=array)
        self.initializers[value.name] = value
        return value

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = ONNX_DOMAIN,
        num_outputs: int | None = None,
        name: str | None = None,
        output_types: Sequence[tuple[Any, Sequence[Dim]]] | None = None,
    ) -> Node:
        """Creates a node, infers its output types and appends it.

        Args:
            op_type: Op name, registered in :mod:`graphdist.ir.ops`.
            inputs: Input values (``None`` for omitted optional inputs).
            attrs: Op attributes.
            domain: Op domain.
            num_outputs: Output count for variadic ops (Split).
            name: Node name hint; defaults to the op type.
            output_types: ``(dtype, shape)`` per output to skip inference
                (import of ONNX graphs uses it).

        Returns:
            The new node; its outputs are in ``node.outputs``.

        Raises:
            GraphError: The op is unknown or its inputs do not type-check.
        """
        node = Node(op_type, inputs, attrs, domain=domain)
        node.name = self.unique_name(name or op_type.lower(), node=True)
        if output_types is None:
            opdef = get_opdef(op_type, domain, self.opset_imports.get(domain))
            output_types = opdef.infer(node, num_outputs)
        for index, (dtype, shape) in enumerate(output_types):
            out = Value(self.unique_name(node.name if index == 0 else f"{node.name}_{index}"), dtype, shape)
            out._producer, out.index = node, index
            node.outputs.append(out)
        self.append(node)
        return node

    def append(self, node: Node) -> None:
        """Adds an already built node where the cursor is (by default: last); its inputs must be defined earlier."""
        if node._graph is not None and node._graph is not self:
            raise GraphError(f"node {node.name} ({node.qualified_op}) belongs to graph {node._graph.name!r}; "
                             "remove it there first")
        node._graph = self
        if self._cursor is None:
            self.nodes.append(node)
            return
        anchor, after, position = self._cursor
        if not (position < len(self.nodes) and self.nodes[position] is anchor):  # the list changed meanwhile
            position = self._index_of(anchor)
        if after:
            self.nodes.insert(position + 1, node)
            self._cursor = (node, True, position + 1)  # the next node goes after this one: order kept
        else:
            self.nodes.insert(position, node)
            self._cursor = (anchor, False, position + 1)

    @contextmanager
    def inserting_before(self, node: Node) -> Iterator[None]:
        """Within the ``with`` block, :meth:`add_node` (and :meth:`append`) insert before ``node``, in order.

        As torch.fx's ``Graph.inserting_before``::

            with graph.inserting_before(reader):
                total = graph.add_node("Add", [a, b])
        """
        yield from self._inserting(node, after=False)

    @contextmanager
    def inserting_after(self, node: Node) -> Iterator[None]:
        """Within the ``with`` block, :meth:`add_node` inserts after ``node``; successive nodes keep their order."""
        yield from self._inserting(node, after=True)

    def _inserting(self, node: Node, *, after: bool) -> Iterator[None]:
        saved = self._cursor
        self._cursor = (node, after, self._index_of(node))
        try:
            yield
        finally:
            self._cursor = saved

    def _index_of(self, node: Node) -> int:
        if node._graph is not self:
            raise GraphError(f"node {node.name} ({node.qualified_op}) is not in graph {self.name!r}")
        for position, other in enumerate(self.nodes):
            if other is node:
                return position
        raise GraphError(f"node {node.name} ({node.qualified_op}) is not in graph {self.name!r}'s node list")

    def insert_before(self, anchor: Node, nodes: Node | Iterable[Node]) -> None:
        """Inserts ``nodes`` (one node or several, in order) right before ``anchor`` in the node order.

        Nodes already in this graph are moved there. Costs one scan of the node list per call.
        """
        self._insert(anchor, nodes, after=False)

    def insert_after(self, anchor: Node, nodes: Node | Iterable[Node]) -> None:
        """Inserts ``nodes`` (one node or several, in order) right after ``anchor`` in the node order.

        Nodes already in this graph are moved there. Costs one scan of the node list per call.
        """
        self._insert(anchor, nodes, after=True)

    def _insert(self, anchor: Node, nodes: Node | Iterable[Node], *, after: bool) -> None:
        batch = [nodes] if isinstance(nodes, Node) else list(nodes)
        if not batch:
            return
        for node in batch:
            if node is anchor:
                raise GraphError(f"cannot insert node {node.name} next to itself")
            if node._graph is not None and node._graph is not self:
                raise GraphError(f"node {node.name} ({node.qualified_op}) belongs to graph "
                                 f"{node._graph.name!r}; remove it there first")
        moving = {id(n) for n in batch if n._graph is self}
        if moving:
            self.nodes[:] = [n for n in self.nodes if id(n) not in moving]
        position = self._index_of(anchor) + (1 if after else 0)
        for node in batch:
            node._graph = self
        self.nodes[position:position] = batch

    def set_nodes(self, nodes: Iterable[Node], *, safe: bool = True) -> None:
        """Makes ``nodes`` the graph's node list, in one step linear in the graph's size.

        For passes that rebuild the order wholesale (replication, accumulation):
        nodes not yet in the graph join it; nodes of the graph left out are
        removed as by :meth:`remove`.

        Args:
            nodes: The new node order (must be topological; :func:`graphdist.ir.verify` checks).
            safe: Check that no output of a node left out is read by a node that
                stays or is a graph output. ``False`` for a caller that rewires
                those readers right after (it must).

        Raises:
            GraphError: A node belongs to another graph, or (``safe``) a removed
                node's output is still read; nothing is changed then.
        """
        order = list(nodes)
        kept = {id(n) for n in order}
        for node in order:
            if node._graph is not None and node._graph is not self:
                raise GraphError(f"node {node.name} ({node.qualified_op}) belongs to graph "
                                 f"{node._graph.name!r}; remove it there first")
        dropped = [n for n in self.nodes if id(n) not in kept]
        if safe:
            self._check_removable(dropped, keep=kept)
        for node in dropped:
            node.detach_inputs()
            node._graph = None
        for node in order:
            node._graph = self
        self.nodes = order

    def remove(self, nodes: Node | Iterable[Node], *, safe: bool = True) -> None:
        """Removes one node or several, in one pass over the node list (linear in the graph's size).

        Args:
            nodes: The nodes to remove. Their outputs may be read only by nodes
                removed with them (a dead chain goes in one call).
            safe: Refuse when an output is still read (by a node that stays, or
                as a graph output). ``False`` skips the check, for a caller that
                has handed the outputs over (:meth:`replace_node` does it for you).

        Raises:
            GraphError: ``safe`` and an output is still read; nothing is removed then.
        """
        doomed = [nodes] if isinstance(nodes, Node) else list(nodes)
        if not doomed:
            return
        ids = {id(n) for n in doomed}
        if safe:
            self._check_removable(doomed, keep=None, doomed=ids)
        for node in doomed:
            node.detach_inputs()
            node._graph = None
        self.nodes[:] = [n for n in self.nodes if id(n) not in ids]

    def _check_removable(self, nodes: Sequence[Node], *, keep: set[int] | None = None,
                         doomed: set[int] | None = None) -> None:
        """Raises unless the outputs of ``nodes`` are read only by removed nodes.

        A reader is removed when it is in ``doomed`` (ids), or (``keep`` given) not in ``keep``.
        """
        outputs = {id(v) for v in self.outputs}
        for node in nodes:
            for out in node.outputs:
                stays = id(out) in outputs or any(
                    (id(user) in keep) if keep is not None else (id(user) not in doomed) for user, _ in out.uses)
                if stays:
                    raise GraphError(
                        f"cannot remove node {node.name} ({node.qualified_op}): its output "
                        f"%{out.name} is still used; rewire it with replace_all_uses_with first"
                    )

    def remove_node(self, node: Node) -> None:
        """Removes a node whose outputs are no longer used (:meth:`remove` of one node)."""
        self.remove(node)

    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        """Removes several nodes at once (:meth:`remove`)."""
        self.remove(nodes)

    def replace_node(self, old: Node, new: Node, *, keep_values: bool = False) -> None:
        """Puts ``new`` in ``old``'s place: ``old``'s readers read ``new``, and ``old`` leaves the graph.

        ``new`` joins the graph right before ``old`` when it is not in it yet.

        Args:
            old: The node to replace (in this graph).
            new: Its replacement, with as many outputs, of the same types.
            keep_values: Hand ``old``'s output values themselves over to ``new``
                (their names, readers and graph-output positions stay; ``new``'s
                own outputs, which nothing may read, are dropped), instead of
                rewiring their readers to ``new``'s outputs.

        Raises:
            GraphError: The output counts or types differ, or (``keep_values``)
                one of ``new``'s outputs is read.
        """
        if len(old.outputs) != len(new.outputs):
            raise GraphError(f"replace_node: {old.name} ({old.qualified_op}) has {len(old.outputs)} output(s) but "
                             f"{new.name} ({new.qualified_op}) has {len(new.outputs)}")
        for before, after in zip(old.outputs, new.outputs):
            self._check_replacement(before, after)
            if keep_values and (after.uses or any(out is after for out in self.outputs)):
                raise GraphError(f"replace_node: %{after.name} of {new.name} is read; with keep_values=True "
                                 f"{new.name}'s own outputs must be unread")
        if new._graph is not self:
            self.insert_before(old, new)
        if keep_values:
            handed = list(old.outputs)
            old.outputs = []
            new.outputs = []
            for value in handed:
                new.add_output(value)
        else:
            self.replace_all_uses_with_many(zip(old.outputs, new.outputs))
        self.remove(old)

    @staticmethod
    def _check_replacement(old: Value, new: Value) -> None:
        if old.dtype != new.dtype:
            raise GraphError(
                f"replace_all_uses_with: %{old.name} is {old.type_str()} but the replacement "
                f"%{new.name} is {new.type_str()}; insert a Cast first"
            )
        if len(old.shape) != len(new.shape) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(old.shape, new.shape)
        ):
            raise GraphError(
                f"replace_all_uses_with: %{old.name} is {old.type_str()} but the replacement "
                f"%{new.name} is {new.type_str()}; shapes must match (up to symbolic dimensions)"
            )

    def replace_all_uses_with(self, old: Value, new: Value, *, exclude: Iterable[Node] = ()) -> int:
        """Makes every reader of ``old`` (nodes and graph outputs) read ``new``.

        Costs the number of ``old``'s uses plus a scan of the graph outputs: to
        rewire many values, use :meth:`replace_all_uses_with_many`.

        Args:
            old: The value to stop reading.
            new: Its replacement.
            exclude: Nodes that keep reading ``old``; typically the node that
                computes ``new`` from ``old`` (``y = AllReduce(x)`` replacing ``x``).

        Returns:
            The number of uses rewired.

        Raises:
            GraphError: dtypes differ, or shapes differ other than by symbolic dims.
        """
        if old is new:
            return 0
        self._check_replacement(old, new)
        skip = {id(n) for n in exclude}
        count = 0
        for node, index in list(old.uses):
            if id(node) not in skip:
                node.replace_input(index, new)
                count += 1
        if old in self.outputs:  # identity (Value has no __eq__), scanned in C
            for position, out in enumerate(self.outputs):
                if out is old:
                    self.outputs[position] = new
                    count += 1
        return count

    def replace_all_uses_with_many(self, pairs: Iterable[tuple[Value, Value]]) -> int:
        """:meth:`replace_all_uses_with` for each ``(old, new)`` pair in order, the graph outputs updated once.

        The result is that of the calls one after the other (a ``new`` that an
        earlier pair replaced is followed to its replacement), at the cost of
        the uses rewired plus one scan of the graph outputs, whatever the
        number of pairs.

        Returns:
            The number of uses rewired.

        Raises:
            GraphError: A pair's dtypes differ, or its shapes differ other than
                by symbolic dims (the pairs before it are applied).
        """
        replaced: dict[int, tuple[Value, Value]] = {}  # id(old) -> (old, new): old kept alive, its id unique

        def current(value: Value) -> Value:
            while id(value) in replaced:
                value = replaced[id(value)][1]
            return value

        count = 0
        for old, new in pairs:
            new = current(new)
            if old is new:
                continue
            self._check_replacement(old, new)
            for node, index in list(old.uses):
                node.replace_input(index, new)
                count += 1
            replaced[id(old)] = (old, new)
        if replaced:
            for position, out in enumerate(self.outputs):
                while id(out) in replaced:  # each hop is one rewiring of the calls one after the other
                    out = replaced[id(out)][1]
                    count += 1
                self.outputs[position] = out
        return count

    # -------------------------------------------------------------- queries
    def values(self) -> Iterator[Value]:
        """Every value: inputs, initializers, then node outputs in order."""
        yield from self.inputs
        yield from self.initializers.values()
        for node in self.nodes:
            yield from node.outputs

    def find_nodes(self, op_type: str, domain: str | None = None) -> list[Node]:
        """Nodes with the given op type (and domain when given)."""
        return [n for n in self.nodes if n.op_type == op_type and (domain is None or n.domain == domain)]

    def topological_sort(self, after: Mapping[int, Sequence[Node]] | None = None) -> None:
        """Reorders ``nodes`` so every node follows its producers (stable).

        Args:
            after: Ordering edges besides the data edges: node id -> nodes it must follow (a collective
                that waits for other nodes' segments, ``LimitParameterGathersPass``).

        Raises:
            GraphError: The graph has a cycle.
        """
        position = {id(n): i for i, n in enumerate(self.nodes)}
        indegree = {id(n): 0 for n in self.nodes}
        waiters: dict[int, list[Node]] = {}
        for node in self.nodes:
            for producer in _producers(node):
                if id(producer) in indegree:
                    indegree[id(node)] += 1
        for node in self.nodes:
            for earlier in (after or {}).get(id(node), ()):
                if id(earlier) in indegree:
                    indegree[id(node)] += 1
                    waiters.setdefault(id(earlier), []).append(node)
        import heapq

        ready = [(position[id(n)], n) for n in self.nodes if indegree[id(n)] == 0]
        heapq.heapify(ready)
        ordered: list[Node] = []
        while ready:
            _, node = heapq.heappop(ready)
            ordered.append(node)
            for consumer in (*_consumers(node), *waiters.get(id(node), ())):
                if id(consumer) in indegree:
                    indegree[id(consumer)] -= 1
                    if indegree[id(consumer)] == 0:
                        heapq.heappush(ready, (position[id(consumer)], consumer))
        if len(ordered) != len(self.nodes):
            stuck = [n.name for n in self.nodes if indegree[id(n)] > 0][:5]
            raise GraphError(f"graph {self.name!r} has a cycle through nodes {stuck}")
        self.nodes = ordered

    def copy(self) -> Graph:
        """Deep copy of structure (constant arrays are shared, not copied)."""
        new = Graph(self.name, self.stage, opset_imports=self.opset_imports)
        new.meta = self.meta.copy()
        new._names = set(self._names)
        new._node_names = set(self._node_names)
        new._next_suffix = self._next_suffix
        mapping: dict[int, Value] = {}

        def clone(value: Value) -> Value:
            twin = Value(value.name, value.dtype, value.shape, const_value=value.const_value)
            twin.meta = dict(value.meta)
            mapping[id(value)] = twin
            return twin

        new.inputs = [clone(v) for v in self.inputs]
        new.initializers = {name: clone(v) for name, v in self.initializers.items()}
        for node in self.nodes:
            attrs = {k: list(v) if isinstance(v, list) else v for k, v in node.attrs.items()}
            twin = Node(node.op_type, [None if v is None else mapping[id(v)] for v in node.inputs], attrs,
                        domain=node.domain, name=node.name)
            twin.device, twin.replica, twin.meta = node.device, node.replica, dict(node.meta)
            for out in node.outputs:
                out_twin = clone(out)
                out_twin._producer, out_twin.index = twin, out.index
                twin.outputs.append(out_twin)
            new.append(twin)
        new.outputs = [mapping[id(v)] for v in self.outputs]
        return new

    # Views (API.md's Graph methods): each calls the free function its module registered with
    # :func:`register_view`, so this module holds the data and imports none of the modules that view it.

    def summary(self) -> str:
        """A readable text listing, with overview tables when placed (:func:`graphdist.ir.graph_summary`)."""
        return _view("summary")(self)

    def to_onnx(self, *, opset: int | None = None) -> Any:
        """Lowers to an ``onnx.ModelProto`` (:func:`graphdist.ir.to_onnx`)."""
        return _view("to_onnx")(self) if opset is None else _view("to_onnx")(self, opset=opset)

    def to_dot(self, **options: Any) -> str:
        """Graphviz DOT text: devices as clusters, collectives highlighted (:func:`graphdist.ir.graph_to_dot`)."""
        return _view("to_dot")(self, **options)

    def render(self, path: Any, **options: Any) -> Any:
        """Writes the graph as SVG or PNG by ``path``'s suffix (``.dot``: the DOT text) and returns the path
        (:func:`graphdist.ir.render_graph`; needs Graphviz's ``dot``).
        """
        return _view("render")(self, path, **options)

    def to_networkx(self) -> Any:
        """A ``networkx.MultiDiGraph`` of the graph (:func:`graphdist.ir.graph_to_networkx`)."""
        return _view("to_networkx")(self)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<Graph {self.name!r} stage={self.stage} nodes={len(self.nodes)} inputs={len(self.inputs)}>"


#: View name -> the free function that makes it; filled by the view modules as ``graphdist.ir`` imports them.
_VIEWS: dict[str, Callable[..., Any]] = {}


def register_view(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Makes ``function(graph, ...)`` the implementation of ``Graph.<name>`` (a view module calls it once)."""
    _VIEWS[name] = function
    return function


def _view(name: str) -> Callable[..., Any]:
    try:
        return _VIEWS[name]
    except KeyError:
        raise GraphError(f"Graph.{name} is not available: the module that provides it was not imported; "
                         "import graphdist (or graphdist.ir) first") from None


def _producers(node: Node) -> Iterable[Node]:
    seen: set[int] = set()
    for value in node.inputs:
        if value is not None and value.producer is not None and id(value.producer) not in seen:
            seen.add(id(value.producer))
            yield value.producer


def _consumers(node: Node) -> Iterable[Node]:
    seen: set[int] = set()
    for out in node.outputs:
        for consumer, _ in out.uses:
            if id(consumer) not in seen:
                seen.add(id(consumer))
                yield consumer
