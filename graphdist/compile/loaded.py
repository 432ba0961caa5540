"""``LoadedPlan``: a plan read from its directory, called like the step it was exported from."""

from __future__ import annotations

import json
import logging
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from graphdist import nest
from graphdist.compile.guards import specialised_from_json
from graphdist.compile.interface import rebuild_results, result_value
from graphdist.compile.plan import Plan
from graphdist.compile.plan_files import (
    PLAN_FILE,
    array_digest,
    decode_treedef,
    describe_outline,
    npz_bytes,
    outline,
    sha256_of,
    write_plan_directory,
)
from graphdist.errors import PlanError
from graphdist.ir.graph import Graph
from graphdist.trace.values import DistributedValues

if TYPE_CHECKING:  # the protocol imports every pass; loading a plan needs none of them
    from graphdist.compile.target import CompileTarget

__all__ = ["LoadedPlan"]

logger = logging.getLogger(__name__)


class LoadedPlan:
    """A plan loaded from a directory: call it like the step it was exported from.

    Arguments are numpy arrays (and the Python constants the step was traced
    with). Where the step took per-replica values, pass a
    :class:`~graphdist.PerReplica` or a plain numpy global batch, which is
    split across replicas as ``experimental_distribute_dataset`` would.
    Results have the step's structure (``PerReplica`` where the step returned
    per-replica values). Every call updates the plan's variables.

    Attributes:
        directory: The directory it was loaded from (or last saved to in place); ``None`` for a
            re-planned plan not saved yet.
        name: The step's name.
        plan: The runnable :class:`~graphdist.compile.plan.Plan`.
        backend_name: The backend its segments were compiled with.
        devices: Devices it runs on.
        metadata: The parsed ``plan.json``.
    """

    def __init__(self, directory: Path | None, doc: dict[str, Any], plan: Plan, files: dict[str, bytes],
                 variables: dict[str, np.ndarray], arguments: tuple[Any, list[dict[str, Any]]],
                 inputs: dict[str, dict[str, Any]]) -> None:
        # Private: use load_plan().
        self.directory = directory
        self.metadata = doc
        self.name: str = doc["name"]
        self.plan = plan
        self.backend_name = plan.backend_name
        self.devices = list(plan.devices)
        self._files = files
        self._variables = variables
        self._arg_outline, self._arg_leaves = arguments
        self._inputs = inputs
        self._updates = [(u["output"], u["variable"]) for u in doc["updates"]]
        outputs = doc["outputs"]
        self._num_results = len(outputs["names"])
        self._output_treedef = decode_treedef(outputs["structure"], "outputs.structure")
        self._output_counts: list[int | None] = list(outputs["counts"])
        self._graphs: dict[str, Graph] = {"partitioned": plan.graph}
        replicas = doc.get("replicas") or {}
        # This worker's replicas among all replicas in sync: a global batch argument is split over all of
        # them and this worker takes its own (MultiWorkerMirroredStrategy).
        self._replica_offset = int(replicas.get("offset", 0))
        self._replicas_in_sync = replicas.get("in_sync")
        #: Inputs the step was specialised on (their values decided shapes): name -> (argument, value).
        self._specialised = specialised_from_json((doc.get("traced") or {}).get("specialised"))
        plan._owner = weakref.ref(self)

    # ------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = nest.flatten((args, kwargs), is_leaf=lambda v: isinstance(v, DistributedValues))
        shape = outline(treedef)
        if shape != self._arg_outline:
            raise PlanError(f"plan {self.name!r} is called with arguments shaped {describe_outline(shape)}, but "
                            f"the step was exported for {describe_outline(self._arg_outline)} (x: an array)")
        feeds: dict[str, np.ndarray] = {}
        for index, (leaf, spec) in enumerate(zip(leaves, self._arg_leaves)):
            kind = spec["kind"]
            if kind == "tensor":
                feeds[spec["input"]] = self._tensor(leaf, spec["input"], index)
            elif kind == "per_replica":
                feeds.update(zip(spec["inputs"], self._components(leaf, spec["inputs"], index)))
            elif kind == "const" and _differs(leaf, spec["value"]):
                raise PlanError(f"plan {self.name!r}: argument leaf {index} was the constant {spec['value']!r} when "
                                f"the step was traced (it is part of the plan), got {leaf!r}")
        feeds.update(self._variables)
        outputs = self.plan.run(feeds)
        for (_, variable), value in zip(self._updates, outputs[self._num_results:]):
            current = self._variables[variable]
            self._variables[variable] = np.array(value, dtype=current.dtype, order="C", copy=True)
        outputs = [result_value(out) for out in outputs[: self._num_results]]
        return rebuild_results(outputs, self._output_counts, self._output_treedef)

    def _tensor(self, value: Any, name: str, index: int) -> np.ndarray:
        spec = self._inputs[name]
        if isinstance(value, DistributedValues):
            raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) was a single array when the step "
                            f"was exported, got a {type(value).__name__}")
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
        else:
            try:
                array = np.asarray(value, dtype=spec["dtype"])
            except (TypeError, ValueError) as err:
                raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) must be an array, got "
                                f"{type(value).__name__} ({err})") from None
        if array.dtype != spec["dtype"] or tuple(array.shape) != spec["shape"]:
            raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) must be "
                            f"{spec['dtype'].name}{list(spec['shape'])}, got {array.dtype.name}{list(array.shape)}; "
                            "an exported plan is specialised to the shapes it was traced with")
        fixed = self._specialised.get(name)
        if fixed is not None and not np.array_equal(array, fixed[1]):
            raise PlanError(f"plan {self.name!r}: argument leaf {index} ({name}) decides shapes in the step, which "
                            f"was traced and compiled for its value {fixed[1].tolist()}; got {array.tolist()}. "
                            "Export one plan per value (or call the gd.function, which traces each value)")
        return array

    def _components(self, value: Any, names: list[str], index: int) -> list[np.ndarray]:
        count = len(names)
        if isinstance(value, DistributedValues):
            if len(value.values) != count:
                raise PlanError(f"plan {self.name!r}: argument leaf {index} needs {count} replica components, got "
                                f"{len(value.values)}")
            return [self._tensor(v, n, index) for v, n in zip(value.values, names)]
        from graphdist.data.split import split_global_batch

        array = np.asarray(value)
        shapes = [self._inputs[n]["shape"] for n in names]
        if array.ndim == 0 or any(len(s) == 0 for s in shapes):
            raise PlanError(f"plan {self.name!r}: argument leaf {index} takes one value per replica ({count}); pass "
                            "a PerReplica or a global batch (an array whose first dimension is split across "
                            f"replicas), got {array.dtype.name}{list(array.shape)}")
        # This worker's part (split among its replicas), or under several workers the whole global batch
        # (every worker's part: this worker takes its own replicas' rows, as experimental_distribute_dataset).
        total = int(self._replicas_in_sync or count)
        per_replica = max(int(s[0]) for s in shapes)
        everyone = total > count and int(array.shape[0]) == per_replica * total
        total, offset = (total, self._replica_offset) if everyone else (count, 0)
        full = max(int(array.shape[0]), per_replica * total)
        parts = [part[0] for part in split_global_batch([array], full, total, range(offset, offset + count))]
        if [p.shape for p in parts] != shapes:
            raise PlanError(
                f"plan {self.name!r}: argument leaf {index}: a global batch of shape {list(array.shape)} splits "
                f"into {[list(p.shape) for p in parts]} across {count} replicas, but the plan was exported for "
                f"per-replica shapes {[list(s) for s in shapes]} (global batch "
                f"{sum(int(s[0]) for s in shapes)}); pass a global batch of that size")
        return [self._tensor(p, n, index) for p, n in zip(parts, names)]

    # ------------------------------------------------------------- replan
    def replan(self, strategy: CompileTarget, *, backend: str | None = None) -> LoadedPlan:
        """This plan for another strategy or device count, made by the strategy's passes from the traced
        step stored in the plan (no Python code), with the variables' current values.

        See :mod:`graphdist.compile.replan` for what can be re-planned.

        Returns:
            A new :class:`LoadedPlan` (``directory`` ``None`` until :meth:`save`).

        Raises:
            PlanError: The plan predates re-planning (schema version 1) or cannot be re-planned for
                ``strategy`` (the message says why).
        """
        from graphdist.compile.replan import replan
        from graphdist.compile.step import StepRecord
        from graphdist.ir.onnx_io import from_onnx

        entry = self.metadata.get("graphs", {}).get("traced")
        if entry is None or "traced" not in self.metadata:
            StepRecord.from_document(self.metadata, Graph(), {})  # raises the schema-version error
        traced = from_onnx(onnx.ModelProto.FromString(self._files[entry["file"]]))
        traced.stage = "traced"
        values = {name: value.copy() for name, value in self._variables.items()}
        record = StepRecord.from_document(self.metadata, traced, values)
        return replan(record, strategy, backend=backend, plan_backend=self.backend_name,
                      io_names=self.metadata.get("io_names"))

    # ------------------------------------------------------------- state
    @property
    def variables(self) -> dict[str, np.ndarray]:
        """Current variable values (copies), keyed by the variable's input name (``mlp/dense_0/kernel``)."""
        return {name: value.copy() for name, value in self._variables.items()}

    def graph(self, stage: str = "partitioned") -> Graph:
        """The exported graph at ``stage`` (``"traced"``, ``"rewritten"`` or ``"partitioned"``)."""
        if stage not in self._graphs:
            from graphdist.ir.onnx_io import from_onnx

            entry = self.metadata["graphs"].get(stage)
            if entry is None:
                raise PlanError(f"plan {self.name!r} has no {stage!r} graph; it has "
                                f"{', '.join(self.metadata['graphs']) or 'none'}")
            graph = from_onnx(onnx.ModelProto.FromString(self._files[entry["file"]]))
            graph.stage = stage
            self._graphs[stage] = graph
        return self._graphs[stage]

    def summary(self) -> str:
        """The plan's summary table (see :meth:`Plan.summary`)."""
        return self.plan.summary()

    # -------------------------------------------------------------- save
    def _current_files(self) -> dict[str, bytes]:
        doc = json.loads(json.dumps(self.metadata))
        arrays = []
        for info in doc["variables"]:
            array = self._variables[info["input"]]
            info["sha256"] = array_digest(array)
            arrays.append((info["entry"], array))
        data = npz_bytes(arrays)
        doc["variables_file"] = {"file": doc["variables_file"]["file"], "sha256": sha256_of(data)}
        files = dict(self._files)
        files[doc["variables_file"]["file"]] = data
        files[PLAN_FILE] = (json.dumps(doc, indent=1) + "\n").encode()
        return files

    def save(self, directory: str | os.PathLike[str] | None = None, *, overwrite: bool = False) -> str:
        """Writes the plan with its current variables, atomically.

        Args:
            directory: Where to write; ``None`` (default) replaces the
                directory the plan was loaded from (``variables.npz`` and its
                checksums in ``plan.json`` and the manifest change together:
                the whole directory is rewritten and swapped in).
            overwrite: Replace an existing plan at ``directory``.

        Returns:
            The directory's absolute path.

        Raises:
            PlanError: The target holds files graphdist did not write (they would be lost), or exists
                and neither ``overwrite`` nor an in-place save allows replacing it.
        """
        if directory is None and self.directory is None:
            raise PlanError(f"plan {self.name!r} was made in memory (re-planned) and has no directory yet; pass "
                            "save(directory)")
        target = Path(directory).absolute() if directory is not None else self.directory
        in_place = self.directory is not None and target.resolve() == self.directory.resolve()
        files = self._current_files()
        dest = write_plan_directory(target, files, overwrite or in_place, what=f"plan {self.name!r}: save")
        if in_place or self.directory is None:
            self._files = {k: v for k, v in files.items() if k != PLAN_FILE}
            self.metadata = json.loads(files[PLAN_FILE])
            self.directory = dest
        logger.info("saved plan %s to %s", self.name, dest)
        return str(dest)

    def export(self, directory: str | os.PathLike[str], *, overwrite: bool = False) -> str:
        """Same as :meth:`save` to ``directory`` (what ``loaded.plan.export(directory)`` calls)."""
        return self.save(directory, overwrite=overwrite)

    def __repr__(self) -> str:
        return (f"<LoadedPlan {self.name!r} from {self.directory} segments={len(self.plan.segments)} "
                f"devices={self.devices} backend={self.backend_name}>")


def _differs(value: Any, constant: Any) -> bool:
    """Whether an argument differs from the Python constant the step was traced with."""
    if isinstance(value, (np.ndarray, DistributedValues)) or type(value) is not type(constant):
        return not (isinstance(value, (int, float)) and isinstance(constant, (int, float))
                    and not isinstance(value, bool) and not isinstance(constant, bool) and value == constant)
    return bool(value != constant)
